#pragma once
// The kernels behind ops/embedding.h, one set per device (ops/dispatch.h). They
// work on a block of the table's rows at a time, so that a table held by blocks
// (autograd::LeafByRows) and a whole one take the same kernels.
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct EmbeddingKernels {
  // For each id of ids (i64 [N]) in [first_id, first_id + rows.size(0)), out[i]
  // (f32 [N, H]) = rows[id - first_id] (f32 or bf16 [R, H]); the other rows of out are untouched.
  void (*gather)(const Tensor& ids, const Tensor& rows, int64_t first_id, const Tensor& out);
  // The backward: for the same ids, d[id - first_id] += g[i] (d f32 [R, H], g f32 [N, H]),
  // in ids' order for every element.
  void (*scatter_add)(const Tensor& ids, const Tensor& g, int64_t first_id, const Tensor& d);
};

KernelTable<EmbeddingKernels>& embedding_kernels();

}  // namespace tp::ops
