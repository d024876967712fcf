#pragma once
// Choosing the next token at tp > 1 (the choice itself is ops::sample_tokens):
// greedy over a vocabulary split across the ranks without gathering the rows.
#include <cstdint>
#include <vector>

#include "tp/distributed/process_group.h"
#include "tp/ops/sampling.h"

namespace tp::generation {

using ops::SamplingOptions;

// Greedy over a vocabulary split across `group`: this rank holds `logits` [B, n],
// ids [vocab_start, vocab_start + n) of each row, and the ranks' pieces follow
// each other in rank order. Each rank takes its piece's best and the ranks swap
// one (logit, id) pair per row, instead of all-gathering [B, V] logits: the
// token ops::sample_tokens' greedy would pick from the whole row.
// `rank0_flag` (rank 0's value counts) comes back on every rank, for a decision
// that rides with the tokens. Collective.
std::vector<int64_t> vocab_parallel_argmax(const Tensor& logits, int64_t vocab_start, dist::ProcessGroup& group,
                                           int64_t* rank0_flag = nullptr);

}  // namespace tp::generation
