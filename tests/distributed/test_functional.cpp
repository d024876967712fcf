// Differentiable region collectives: closed-form values (tensors filled with
// rank ids) and the backward of each against its documented adjoint.
#include "dist_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/distributed/functional.h"

namespace tp::dist {
namespace {

using testing::expect_close;

Tensor filled(const Shape& shape, double v) { return Tensor::full(shape, v); }

// Sum over ranks of (r + 1): the closed form for an all-reduce of "rank + 1".
double rank_sum(int w) { return w * (w + 1) / 2.0; }

TEST(Functional, CopyToRegion) {
  ProcessGroup& g = world();
  int r = g.rank(), w = g.size();
  Tensor x = filled({2, 3}, r + 1).set_requires_grad(true);
  Tensor y = copy_to_region(x, g);
  expect_close(y, filled({2, 3}, r + 1), 0, "fwd identity");
  autograd::backward(y, filled({2, 3}, r + 1));
  expect_close(x.grad(), filled({2, 3}, rank_sum(w)), 0, "bwd all-reduce");
  // Without autograd it is free: the same tensor comes back.
  Tensor z = filled({2}, 1);
  EXPECT_TRUE(copy_to_region(z, g).is_same(z));
}

TEST(Functional, ReduceFromRegion) {
  ProcessGroup& g = world();
  int r = g.rank(), w = g.size();
  Tensor x = filled({2, 3}, r + 1).set_requires_grad(true);
  Tensor y = reduce_from_region(x, g);
  expect_close(y, filled({2, 3}, rank_sum(w)), 0, "fwd all-reduce");
  expect_close(x, filled({2, 3}, r + 1), 0, "input untouched");
  autograd::backward(y, filled({2, 3}, r + 1));
  expect_close(x.grad(), filled({2, 3}, r + 1), 0, "bwd identity");
}

TEST(Functional, GatherFromAndScatterToRegionUneven) {
  ProcessGroup& g = world();
  int r = g.rank(), w = g.size();
  // 10 columns by the chunk rule: gather puts them back in rank order.
  Tensor full = Tensor::randn({3, 10}, 5);
  Tensor x = scatter_to_region(full.clone().set_requires_grad(true), 1, g);
  ChunkSpan span = chunk_span(10, w, r);
  expect_close(x, full.narrow(1, span.offset, span.size), 0, "scatter fwd slice");

  Tensor piece = full.narrow(1, span.offset, span.size).clone().set_requires_grad(true);
  Tensor y = gather_from_region(piece, 1, g);
  expect_close(y, full, 0, "gather fwd");
  Tensor gy = Tensor::randn({3, 10}, 6);  // the same on every rank (replicated gradient)
  autograd::backward(y, gy);
  expect_close(piece.grad(), gy.narrow(1, span.offset, span.size), 0, "gather bwd slice");

  Tensor src = full.clone().set_requires_grad(true);
  Tensor s = scatter_to_region(src, -1, g);
  autograd::backward(s, filled(s.shape(), r + 1));
  // Each rank's gradient piece is (its rank + 1): the gathered gradient shows every piece.
  std::vector<float> got = src.grad().to_vector();
  for (int q = 0; q < w; ++q) {
    ChunkSpan sp = chunk_span(10, w, q);
    if (sp.size) {
      EXPECT_EQ(got[sp.offset], q + 1) << "scatter bwd all-gather, piece " << q;
    }
  }
}

TEST(Functional, GatherFromRegionWithOffChunkSizes) {
  ProcessGroup& g = world();
  int r = g.rank();
  Tensor x = filled({r + 1, 2}, r).set_requires_grad(true);  // sizes 1, 2, 3, ...
  Tensor y = gather_from_region(x, 0, g);
  Tensor gy = Tensor::randn(y.shape(), 3);
  autograd::backward(y, gy);
  expect_close(x.grad(), gy.narrow(0, r * (r + 1) / 2, r + 1), 0, "slice at this rank's offset");
}

TEST(Functional, ReduceScatterToRegion) {
  ProcessGroup& g = world();
  int r = g.rank(), w = g.size();
  Tensor x = filled({10, 2}, r + 1).set_requires_grad(true);
  Tensor y = reduce_scatter_to_region(x, 0, g);
  ChunkSpan span = chunk_span(10, w, r);
  expect_close(y, filled({span.size, 2}, rank_sum(w)), 0, "fwd reduce-scatter");
  autograd::backward(y, filled(y.shape(), r + 1));
  std::vector<float> got = x.grad().to_vector();
  for (int q = 0; q < w; ++q) {
    ChunkSpan sp = chunk_span(10, w, q);
    if (sp.size) {
      EXPECT_EQ(got[sp.offset * 2], q + 1) << "bwd all-gather, piece " << q;
    }
  }
}

TEST(Functional, AllGatherToRegion) {
  ProcessGroup& g = world();
  int r = g.rank(), w = g.size();
  for (bool chunked : {true, false}) {
    int64_t rows = chunked ? chunk_span(10, w, r).size : r + 1;
    Tensor x = filled({rows, 2}, r + 1).set_requires_grad(true);
    Tensor y = all_gather_to_region(x, 0, g);
    // Rank q seeds the gradient with (q + 1) everywhere: each slice receives the sum.
    autograd::backward(y, filled(y.shape(), r + 1));
    expect_close(x.grad(), filled({rows, 2}, rank_sum(w)), 0, chunked ? "bwd reduce-scatter" : "bwd off-chunk");
  }
}

// Sequence parallelism's pair on [B, T, H] along T = 3, which leaves rank 3 of 4 no
// token: all-gather (bwd reduce-scatter) into a block, reduce-scatter (bwd
// all-gather) out of it.
TEST(Functional, SequenceGatherThenReduceScatterWithUnevenAndEmptyChunks) {
  ProcessGroup& g = world();
  int r = g.rank(), w = g.size();
  ChunkSpan mine = chunk_span(3, w, r);
  Tensor x = filled({2, mine.size, 4}, r + 1).set_requires_grad(true);
  Tensor y = all_gather_to_region(x, 1, g);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  for (int64_t t = 0; t < 3; ++t) {
    int owner = 0;
    while (chunk_span(3, w, owner).offset + chunk_span(3, w, owner).size <= t) ++owner;
    expect_close(y.narrow(1, t, 1), filled({2, 1, 4}, owner + 1), 0, "fwd all-gather, token " + std::to_string(t));
  }
  Tensor z = reduce_scatter_to_region(y, 1, g);  // every rank holds the same y: w times this rank's tokens
  expect_close(z, filled({2, mine.size, 4}, w * (r + 1)), 0, "fwd reduce-scatter");
  autograd::backward(z, filled(z.shape(), 1));
  expect_close(x.grad(), filled({2, mine.size, 4}, w), 0, "bwd all-gather then reduce-scatter");
}

TEST(Functional, AllReduceGrad) {
  ProcessGroup& g = world();
  Tensor grad = filled({4}, g.rank() + 1);
  all_reduce_grad(grad, g);
  expect_close(grad, filled({4}, rank_sum(g.size())), 0, "sum");
  Tensor undefined;
  EXPECT_THROW(all_reduce_grad(undefined, g), Error);
}

}  // namespace
}  // namespace tp::dist
