#include "tp/ops/embedding.h"

#include <cstring>

#include "tp/autograd/tape.h"
#include "tp/ops/util.h"
#include "tp/tensor/convert.h"

namespace tp::ops {

Tensor embedding(const Tensor& ids, const Tensor& w, int64_t vocab_start) {
  TP_CHECK(ids.defined() && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
           "embedding: ids must be i64 or i32, got {}", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  check_floating(w, "embedding");
  TP_CHECK(w.dim() == 2, "embedding: weight must be [V, H], got shape {} (ids shape {})", shape_str(w.shape()),
           shape_str(ids.shape()));
  int64_t v = w.size(0), h = w.size(1), n = ids.numel();
  std::vector<int64_t> id = ids.to_int_vector();
  Shape out_shape = ids.shape();
  out_shape.push_back(h);
  Tensor out = Tensor::empty(out_shape);
  float* o = out.data<float>();
  const size_t esize = dtype_size(w.dtype());
  // Rows [r0, r0 + count) of the table from `rows`; the ids outside them untouched.
  auto look_up = [&](const char* rows, int64_t r0, int64_t count) {
#pragma omp parallel for schedule(static) if (n * h > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = id[i] - vocab_start - r0;
      if (r >= 0 && r < count) convert(rows + r * h * esize, w.dtype(), o + i * h, DType::F32, static_cast<size_t>(h));
    }
  };
  std::memset(o, 0, sizeof(float) * static_cast<size_t>(n * h));  // ids outside this slice of the vocabulary
  if (autograd::LeafByRows* by_rows = autograd::leaf_by_rows(w)) {
    // A table held by rows: every block, hit or not (its collectives run on every rank).
    const int64_t step = std::max<int64_t>(by_rows->block_rows(), 1);
    for (int64_t r0 = 0; r0 < v; r0 += step) {
      const int64_t count = std::min(step, v - r0);
      look_up(static_cast<const char*>(by_rows->weight_rows(r0, count).raw_data()), r0, count);
    }
  } else {
    look_up(static_cast<const char*>(w.raw_data()), 0, v);
  }
  if (autograd::needs_grad({w})) {
    autograd::record("embedding", {ids, w}, {out}, [id, w, vocab_start](const std::vector<Tensor>& g) {
      const int64_t v = w.size(0), h = w.size(1);
      const float* gs = g[0].data<float>();
      // Adds the rows [r0, r0 + rows) of the gradient into d (those rows).
      auto scatter = [&](float* d, int64_t r0, int64_t rows) {
        // Columns split over threads, so rows hit by repeated ids never race.
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(id.size()) * h > 65536)
        for (int64_t c0 = 0; c0 < h; c0 += 64) {
          const int64_t c1 = std::min(h, c0 + 64);
          for (size_t i = 0; i < id.size(); ++i) {
            const int64_t r = id[i] - vocab_start - r0;
            if (r < 0 || r >= rows) continue;
            for (int64_t c = c0; c < c1; ++c) d[r * h + c] += gs[i * h + c];
          }
        }
      };
      // A weight taking its gradient by rows gets every block, touched or not
      // (its sink's collectives run on every rank).
      if (autograd::LeafByRows* sink = autograd::leaf_by_rows(w)) {
        const int64_t step = std::max<int64_t>(sink->block_rows(), 1);
        for (int64_t r0 = 0; r0 < v; r0 += step) {
          Tensor block = sink->begin_grad_block(r0, std::min(step, v - r0));
          scatter(block.data<float>(), r0, block.size(0));
          sink->end_grad_block();
        }
        return std::vector<Tensor>{Tensor(), Tensor()};
      }
      // Scatter-added straight into the weight's gradient buffer when it has one
      // (a vocabulary-sized table: no zeroed temporary, no pass to add it).
      Tensor buffer = autograd::leaf_grad_buffer(w);
      Tensor dw = buffer.defined() ? Tensor() : Tensor::zeros(w.shape());
      scatter(buffer.defined() ? buffer.data<float>() : dw.data<float>(), 0, v);
      return std::vector<Tensor>{Tensor(), dw};
    });
  }
  return out;
}

}  // namespace tp::ops
