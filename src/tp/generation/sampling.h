#pragma once
// Choosing the next token from logits: greedy, or sampling with temperature,
// top-k and top-p (nucleus) from a seeded, counter-based random stream, so the
// same seed gives the same tokens on any machine and at any tp_size.
#include <cstdint>
#include <vector>

namespace tp::generation {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax)
  int64_t top_k = 0;       // 0: no limit
  double top_p = 1.0;      // 1: no limit
  uint64_t seed = 0;
};

// logits [V] of sequence `row` at decoding `step`. Ties in greedy pick the lowest id.
int64_t select_token(const float* logits, int64_t vocab, const SamplingOptions& options, int64_t row, int64_t step);

}  // namespace tp::generation
