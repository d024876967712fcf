#pragma once
// The kernels behind ops/sampling.h, one set per device (ops/dispatch.h).
// Shapes and rules are ops/sampling.h's; outputs are allocated by the op.
#include <vector>

#include "tp/ops/dispatch.h"
#include "tp/ops/sampling.h"

namespace tp::ops {

struct SamplingKernels {
  // ids i64 [B] = one token per row of logits f32 [B, V], row b drawn from (seed, streams[b]) at steps[b].
  void (*sample)(const Tensor& logits, const SamplingOptions& options, const std::vector<int64_t>& streams,
                 const std::vector<int64_t>& steps, const Tensor& ids);
  // out i64 [B, 2] = this piece's (logit bits, id) candidate of each row of logits [B, n].
  void (*argmax_candidates)(const Tensor& logits, int64_t vocab_start, bool first_piece, const Tensor& out);
  // ids i64 [B] = the best of every piece's candidates [pieces, B, 2].
  void (*best_candidates)(const Tensor& candidates, const Tensor& ids);
};

KernelTable<SamplingKernels>& sampling_kernels();

}  // namespace tp::ops
