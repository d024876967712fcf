#pragma once
// Choosing the next token from logits: greedy, or sampling with temperature,
// top-k and top-p (nucleus) from a seeded, counter-based random stream, so the
// same seed gives the same tokens on any machine and at any tp_size.
#include <cstdint>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax)
  int64_t top_k = 0;       // 0: no limit
  double top_p = 1.0;      // 1: no limit
  uint64_t seed = 0;
};

// One token per row of logits [B, V] (f32) -> ids [B] (i64). Greedy takes the
// first of the largest (std::max_element's, NaNs as it treats them); sampling
// draws row b from the stream (options.seed, streams[b]) at steps[b]: the same
// stream and step give the same token whatever else is in the batch.
Tensor sample_tokens(const Tensor& logits, const SamplingOptions& options, const std::vector<int64_t>& streams,
                     const std::vector<int64_t>& steps);

// Greedy over a vocabulary split into pieces held in rank order (the ranks'
// columns of lm_head), without gathering the rows:
//   argmax_candidates: this piece's candidate of each row of logits [B, n], whose
//     columns are ids [vocab_start, vocab_start + n) -> [B, 2] i64 (the logit's
//     float bits, its id; id -1 where the piece is empty). The first piece takes
//     std::max_element's answer (a leading NaN stays); a later piece meets a
//     running maximum that is a number, so its candidate is its first largest number.
//   best_candidates: every piece's candidates [pieces, B, 2], in piece order ->
//     ids [B]: the largest, a tie to the earlier piece (the lower id), exactly the
//     token sample_tokens' greedy picks from the whole row.
Tensor argmax_candidates(const Tensor& logits, int64_t vocab_start, bool first_piece);
Tensor best_candidates(const Tensor& candidates);

}  // namespace tp::ops
