#include "tp/ops/embedding.h"

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/embedding_kernels.h"
#include "tp/ops/util.h"
#include "tp/tensor/convert.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

void gather_cpu(const Tensor& ids, const Tensor& rows_t, int64_t first_id, const Tensor& out) {
  const int64_t n = ids.numel(), h = rows_t.size(1), count = rows_t.size(0);
  const int64_t* id = ids.data<int64_t>();
  const char* rows = static_cast<const char*>(rows_t.raw_data());
  const DType dtype = rows_t.dtype();
  const size_t esize = dtype_size(dtype);
  float* o = out.data<float>();
  parallel_for(n, n * h > 65536, [&](int64_t i) {
    const int64_t r = id[i] - first_id;
    if (r >= 0 && r < count) convert(rows + r * h * esize, dtype, o + i * h, DType::F32, static_cast<size_t>(h));
  });
}

void scatter_add_cpu(const Tensor& ids, const Tensor& g, int64_t first_id, const Tensor& d_t) {
  const int64_t n = ids.numel(), h = d_t.size(1), rows = d_t.size(0);
  const int64_t* id = ids.data<int64_t>();
  const float* gs = g.data<float>();
  float* d = d_t.data<float>();
  // Columns split over threads, so rows hit by repeated ids never race.
  parallel_region(n * h > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t c0 = 0; c0 < h; c0 += 64) {
      const int64_t c1 = std::min(h, c0 + 64);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = id[i] - first_id;
        if (r < 0 || r >= rows) continue;
        for (int64_t c = c0; c < c1; ++c) d[r * h + c] += gs[i * h + c];
      }
    }
  });
}

constexpr EmbeddingKernels kCpuEmbeddingKernels{gather_cpu, scatter_add_cpu};

}  // namespace

KernelTable<EmbeddingKernels>& embedding_kernels() {
  static KernelTable<EmbeddingKernels> table("embedding", &kCpuEmbeddingKernels);
  return table;
}

Tensor embedding(const Tensor& ids, const Tensor& w, int64_t vocab_start) {
  TP_CHECK(ids.defined() && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
           "embedding: ids must be i64 or i32, got {}", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  check_floating(w, "embedding");
  TP_CHECK(w.dim() == 2, "embedding: weight must be [V, H], got shape {} (ids shape {})", shape_str(w.shape()),
           shape_str(ids.shape()));
  const int64_t v = w.size(0), h = w.size(1);
  const Tensor id = ids.to(DType::I64).reshape({ids.numel()});
  Shape out_shape = ids.shape();
  out_shape.push_back(h);
  Tensor out = Tensor::zeros(out_shape);  // zero rows for the ids outside this slice of the vocabulary
  const EmbeddingKernels& k = embedding_kernels().on(id, w);
  if (autograd::LeafByRows* by_rows = autograd::leaf_by_rows(w)) {
    // A table held by rows: every block, hit or not (its collectives run on every rank).
    const int64_t step = std::max<int64_t>(by_rows->block_rows(), 1);
    for (int64_t r0 = 0; r0 < v; r0 += step)
      k.gather(id, by_rows->weight_rows(r0, std::min(step, v - r0)), vocab_start + r0, out);
  } else {
    k.gather(id, w, vocab_start, out);
  }
  if (autograd::needs_grad({w})) {
    autograd::record("embedding", {ids, w}, {out}, [id, w, vocab_start](const std::vector<Tensor>& g) {
      const int64_t v = w.size(0);
      const EmbeddingKernels& k = embedding_kernels().on(id, g[0]);
      // A weight taking its gradient by rows gets every block, touched or not
      // (its sink's collectives run on every rank).
      if (autograd::LeafByRows* sink = autograd::leaf_by_rows(w)) {
        const int64_t step = std::max<int64_t>(sink->block_rows(), 1);
        for (int64_t r0 = 0; r0 < v; r0 += step) {
          k.scatter_add(id, g[0], vocab_start + r0, sink->begin_grad_block(r0, std::min(step, v - r0)));
          sink->end_grad_block();
        }
        return std::vector<Tensor>{Tensor(), Tensor()};
      }
      // Scatter-added straight into the weight's gradient buffer when it has one
      // (a vocabulary-sized table: no zeroed temporary, no pass to add it).
      Tensor buffer = autograd::leaf_grad_buffer(w);
      Tensor dw = buffer.defined() ? Tensor() : Tensor::zeros(w.shape());
      k.scatter_add(id, g[0], vocab_start, buffer.defined() ? buffer : dw);
      return std::vector<Tensor>{Tensor(), dw};
    });
  }
  return out;
}

}  // namespace tp::ops
