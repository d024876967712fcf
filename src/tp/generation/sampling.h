#pragma once
// Choosing the next token from logits: greedy, or sampling with temperature,
// top-k and top-p (nucleus) from a seeded, counter-based random stream, so the
// same seed gives the same tokens on any machine and at any tp_size.
#include <cstdint>
#include <vector>

#include "tp/distributed/process_group.h"

namespace tp::generation {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax)
  int64_t top_k = 0;       // 0: no limit
  double top_p = 1.0;      // 1: no limit
  uint64_t seed = 0;
};

// logits [V] of sequence `row` at decoding `step`. Ties in greedy pick the lowest id.
int64_t select_token(const float* logits, int64_t vocab, const SamplingOptions& options, int64_t row, int64_t step);

// Greedy over a vocabulary split across `group`: this rank holds `logits` [B, n],
// ids [vocab_start, vocab_start + n) of each row, and the ranks' pieces follow
// each other in rank order. Each rank takes its piece's best and the ranks swap
// one (logit, id) pair per row, instead of all-gathering [B, V] logits: the
// token select_token would pick from the whole row (std::max_element's: the
// first of the largest, NaNs as it treats them). `rank0_flag` (rank 0's value
// counts) comes back on every rank, for a decision that rides with the tokens.
// Collective.
std::vector<int64_t> vocab_parallel_argmax(const float* logits, int64_t batch, int64_t n, int64_t vocab_start,
                                           dist::ProcessGroup& group, int64_t* rank0_flag = nullptr);

}  // namespace tp::generation
