#include "tp/distributed/functional.h"

#include "tp/autograd/checkpoint.h"
#include "tp/autograd/tape.h"

namespace tp::dist {
namespace {

// All-gather of pieces that follow the chunk rule for a total of `n` along dim.
Tensor gather_chunks(const Tensor& piece, int64_t dim, int64_t n, ProcessGroup& g) {
  return n % g.size() == 0 ? g.all_gather(piece, dim) : g.all_gather_uneven(piece, dim);
}

// True when `sizes` are exactly the chunk rule's pieces of their sum.
bool follows_chunk_rule(const std::vector<int64_t>& sizes) {
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  for (size_t r = 0; r < sizes.size(); ++r)
    if (chunk_span(n, static_cast<int64_t>(sizes.size()), static_cast<int64_t>(r)).size != sizes[r]) return false;
  return true;
}

// All-gather along d that also reports where this rank's piece landed.
struct Gathered {
  Tensor out;
  std::vector<int64_t> sizes;
  int64_t offset = 0;  // of this rank's piece along d
};
Gathered gather_uneven(const Tensor& x, int64_t d, ProcessGroup& g) {
  Gathered r;
  r.out = g.all_gather_uneven(x, d, &r.sizes);
  for (int q = 0; q < g.rank(); ++q) r.offset += r.sizes[q];
  return r;
}

}  // namespace

Tensor copy_to_region(const Tensor& x, ProcessGroup& g) {
  if (!autograd::needs_grad({x})) return x;
  Tensor out = x.reshape(x.shape());  // a new handle on the same data
  autograd::record("copy_to_region", {x}, {out}, [&g](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
    Tensor gx = grads[0].clone();
    g.all_reduce(gx, ReduceOp::Sum);
    return {gx};
  });
  return out;
}

Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_counts, ProcessGroup& g,
                       std::vector<int64_t>* recv_counts) {
  std::vector<int64_t> received;
  Tensor out = g.all_to_all_v(x, send_counts, &received);
  if (autograd::needs_grad({x}))
    autograd::record("all_to_all_rows", {x}, {out},
                     [&g, received, send_counts](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                       std::vector<int64_t> back;
                       Tensor gx = g.all_to_all_v(grads[0], received, &back);
                       TP_CHECK(back == send_counts, "all_to_all_rows backward: the rows came back in other counts");
                       return {gx};
                     });
  if (recv_counts != nullptr) *recv_counts = std::move(received);
  return out;
}

Tensor reduce_from_region(const Tensor& x, ProcessGroup& g) {
  Tensor out = autograd::kept_output();  // a selective checkpoint's recompute: no second all-reduce
  if (!out.defined()) {
    out = x.clone();
    g.all_reduce(out, ReduceOp::Sum);
  }
  autograd::keep_output(out);
  autograd::drop_kept_output(x);  // the partial sums are not needed once their sum is kept
  if (autograd::needs_grad({x}))
    autograd::record("reduce_from_region", {x}, {out},
                     [](const std::vector<Tensor>& grads) -> std::vector<Tensor> { return {grads[0]}; });
  return out;
}

Tensor gather_from_region(const Tensor& x, int64_t dim, ProcessGroup& g) {
  int64_t d = normalize_dim(dim, x.dim());
  auto [out, sizes, offset] = gather_uneven(x, d, g);
  if (autograd::needs_grad({x})) {
    int64_t len = x.shape()[d];
    autograd::record("gather_from_region", {x}, {out},
                     [d, offset, len](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                       return {grads[0].narrow(d, offset, len).clone()};
                     });
  }
  return out;
}

// Records `out` (this rank's chunk of x along d) with the backward both
// scatters share: all-gather the chunks' gradients back to x's shape.
static Tensor with_gather_backward(const char* name, const Tensor& x, Tensor out, int64_t d, ProcessGroup& g) {
  if (autograd::needs_grad({x})) {
    int64_t n = x.shape()[d];
    autograd::record(name, {x}, {out}, [d, n, &g](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
      return {gather_chunks(grads[0], d, n, g)};
    });
  }
  return out;
}

Tensor scatter_to_region(const Tensor& x, int64_t dim, ProcessGroup& g) {
  int64_t d = normalize_dim(dim, x.dim());
  ChunkSpan span = chunk_span(x.shape()[d], g.size(), g.rank());
  return with_gather_backward("scatter_to_region", x, x.narrow(d, span.offset, span.size).clone(), d, g);
}

Tensor reduce_scatter_to_region(const Tensor& x, int64_t dim, ProcessGroup& g) {
  int64_t d = normalize_dim(dim, x.dim());
  Tensor out = autograd::kept_output();  // a selective checkpoint's recompute: no second reduce-scatter
  if (!out.defined()) out = g.reduce_scatter(x, d, ReduceOp::Sum);
  autograd::keep_output(out);
  autograd::drop_kept_output(x);
  return with_gather_backward("reduce_scatter_to_region", x, out, d, g);
}

Tensor all_gather_to_region(const Tensor& x, int64_t dim, ProcessGroup& g) {
  int64_t d = normalize_dim(dim, x.dim());
  auto [out, sizes, offset] = gather_uneven(x, d, g);
  if (autograd::needs_grad({x})) {
    int64_t len = x.shape()[d];
    bool chunked = follows_chunk_rule(sizes);
    autograd::record("all_gather_to_region", {x}, {out},
                     [d, offset, len, chunked, &g](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                       if (chunked) return {g.reduce_scatter(grads[0], d, ReduceOp::Sum)};
                       // Pieces off the chunk rule: sum everything, keep our slice.
                       Tensor sum = grads[0].clone();
                       g.all_reduce(sum, ReduceOp::Sum);
                       return {sum.narrow(d, offset, len).clone()};
                     });
    // What saves the gathered tensor keeps the shard and gathers it again in the
    // backward (Megatron's sequence parallelism): activations / t, not a whole [T, H].
    autograd::set_rebuild(out, [x, d, &g] { return gather_uneven(x, d, g).out; });
  }
  return out;
}

void all_reduce_grad(Tensor& param_grad, ProcessGroup& g) {
  TP_CHECK(param_grad.defined(), "all_reduce_grad: the gradient is undefined (did backward reach the parameter?)");
  g.all_reduce(param_grad, ReduceOp::Sum);
}

}  // namespace tp::dist
