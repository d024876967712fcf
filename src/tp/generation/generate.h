#pragma once
// The generation loop: prefill every prompt (right-padded into one batch), then
// decode one token per sequence per step from the KV caches until each sequence
// hits an end-of-sequence id or max_new_tokens. Rank 0 picks every token and
// broadcasts it, so all ranks always continue with the same tokens.
#include <functional>
#include <vector>

#include "tp/generation/sampling.h"
#include "tp/models/auto.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp::generation {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplingOptions sampling;
  std::vector<int64_t> eos_token_ids;  // empty: never stop early
  // Asked on rank 0 before each chosen token is handed out (e.g. "Ctrl-C was
  // pressed"); its answer travels with the token broadcast, so every rank
  // stops after the same token. Empty: never.
  std::function<bool()> should_stop;
};

struct GenerateResult {
  std::vector<std::vector<int64_t>> tokens;  // new tokens per prompt (incl. the EOS that stopped it)
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  bool stopped = false;  // should_stop ended it (the tokens chosen at that step are dropped)
};

// `on_token(row, token)` is called on every rank as tokens are chosen (rank 0 streams them).
GenerateResult generate(PretrainedModel& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& options,
                        const std::function<void(int64_t row, int64_t token)>& on_token = {});

// The ids generation stops at unless told otherwise: the tokenizer's (its
// generation_config.json and tokenizer_config.json) and config.json's
// eos_token_id, each once (an instruct model's end-of-turn token is often in
// only one of them).
std::vector<int64_t> default_eos_token_ids(const PretrainedModel& model, const Tokenizer* tokenizer);

}  // namespace tp::generation
