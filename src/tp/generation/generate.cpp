#include "tp/generation/generate.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "tp/autograd/tape.h"

namespace tp::generation {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rank 0 picks one token per row from logits [B, V] and asks should_stop;
// every rank receives both (the flag rides as element B of the broadcast).
std::vector<int64_t> pick_tokens(const Tensor& logits, const GenerateOptions& options, int64_t step,
                                 dist::ProcessGroup& group, bool& stop) {
  const int64_t B = logits.size(0);
  Tensor chosen = Tensor::zeros({B + 1}, DType::I64);
  if (group.rank() == 0) {
    std::vector<int64_t> streams(static_cast<size_t>(B)), steps(static_cast<size_t>(B), step);
    std::iota(streams.begin(), streams.end(), int64_t{0});
    std::vector<int64_t> ids = ops::sample_tokens(logits, options.sampling, streams, steps).to_int_vector();
    ids.push_back(options.should_stop && options.should_stop() ? 1 : 0);
    chosen = Tensor::from_ints(ids, {B + 1});
  }
  group.broadcast(chosen, 0);
  std::vector<int64_t> tokens = chosen.to_int_vector();
  stop = tokens.back() != 0;
  tokens.pop_back();
  return tokens;
}

// Greedy at tp > 1 with a column-parallel lm_head: every rank keeps its slice of
// the logits and the ranks swap one (logit, id) per row (vocab_parallel_argmax)
// instead of all-gathering [B, V] logits each step (qwen3's 152K vocabulary:
// 600 KB per row) and rank 0 scanning all of them; the same tokens. Sampling
// keeps the gathered logits: its sort and draw need the whole distribution.
bool greedy_on_shards(const PretrainedModel& model, const GenerateOptions& options) {
  return options.sampling.temperature == 0 && model.tp_size() > 1 && !model.mesh().has_dim("ep") &&
         model.can_shard_logits();
}

std::vector<int64_t> pick_on_shards(const CausalLMOutput& out, const GenerateOptions& options,
                                    dist::ProcessGroup& group, bool& stop) {
  int64_t flag = group.rank() == 0 && options.should_stop && options.should_stop() ? 1 : 0;
  std::vector<int64_t> tokens = vocab_parallel_argmax(out.logits, out.vocab_start, group, &flag);
  stop = flag != 0;
  return tokens;
}

}  // namespace

GenerateResult generate(PretrainedModel& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& options, const std::function<void(int64_t, int64_t)>& on_token) {
  TP_CHECK(!prompts.empty(), "generate: no prompts given");
  TP_CHECK(options.max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", options.max_new_tokens);
  autograd::NoGradGuard no_grad;
  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t V = model.config().vocab_size;
  std::vector<int64_t> lengths;
  for (const auto& p : prompts) {
    TP_CHECK(!p.empty(), "generate: prompt {} is empty (it needs at least one token, e.g. BOS)", lengths.size());
    for (int64_t id : p) TP_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
    lengths.push_back(static_cast<int64_t>(p.size()));
  }
  const int64_t T = *std::max_element(lengths.begin(), lengths.end());
  const int64_t max_len = T + options.max_new_tokens;
  TP_CHECK(max_len <= model.config().max_position_embeddings || model.config().max_position_embeddings == 0,
           "prompt ({} tokens) + max_new_tokens ({}) exceeds max_position_embeddings {}", T, options.max_new_tokens,
           model.config().max_position_embeddings);

  GenerateResult result;
  result.tokens.resize(static_cast<size_t>(B));
  if (options.max_new_tokens == 0) return result;
  CausalLM& lm = model.lm();
  // Rank 0 of the group picks: with expert parallelism the ep group (every rank; the
  // tp groups run the same tokens and must continue with the same ones).
  dist::ProcessGroup& group = model.mesh().group(model.mesh().has_dim("ep") ? "ep" : "tp");
  KVState state = lm.make_kv_state(B, max_len);
  const bool on_shards = greedy_on_shards(model, options);
  auto forward = [&](const std::vector<int64_t>& ids, int64_t rows, const std::vector<int64_t>& logit_positions,
                     const std::vector<int64_t>& counts, bool decode) {
    return lm.forward_ids(Tensor::from_ints(ids, {rows, static_cast<int64_t>(ids.size()) / rows}),
                          {.cache = &state, .counts = counts, .logit_positions = logit_positions,
                           .decode = decode, .sharded_logits = on_shards});
  };
  auto pick = [&](const CausalLMOutput& out, int64_t step) {
    return on_shards ? pick_on_shards(out, options, group, result.stopped)
                     : pick_tokens(out.logits, options, step, group, result.stopped);
  };

  // Prefill: prompts right-padded with id 0; row b keeps its first lengths[b] tokens.
  std::vector<int64_t> ids(static_cast<size_t>(B * T), 0), last(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    std::copy(prompts[b].begin(), prompts[b].end(), ids.begin() + b * T);
    last[b] = lengths[b] - 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> next = pick(forward(ids, B, last, lengths, false), 0);
  result.prefill_seconds = seconds_since(t0);
  result.prefill_tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});

  std::vector<bool> done(static_cast<size_t>(B), result.stopped);
  auto take = [&](const std::vector<int64_t>& tokens) {
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      result.tokens[b].push_back(tokens[b]);
      if (on_token) on_token(b, tokens[b]);
      bool eos = std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), tokens[b]) !=
                 options.eos_token_ids.end();
      if (eos || static_cast<int64_t>(result.tokens[b].size()) >= options.max_new_tokens) done[b] = true;
    }
  };
  if (!result.stopped) take(next);

  auto t1 = std::chrono::steady_clock::now();
  std::vector<int64_t> zeros(static_cast<size_t>(B), 0);
  for (int64_t step = 1; std::find(done.begin(), done.end(), false) != done.end(); ++step) {
    next = pick(forward(next, B, zeros, {}, true), step);
    if (result.stopped) break;
    result.decode_tokens += std::count(done.begin(), done.end(), false);
    take(next);
  }
  result.decode_seconds = seconds_since(t1);
  return result;
}

std::vector<int64_t> default_eos_token_ids(const PretrainedModel& model, const Tokenizer* tokenizer) {
  std::vector<int64_t> ids = tokenizer ? tokenizer->eos_token_ids() : std::vector<int64_t>{};
  for (int64_t id : model.config().eos_token_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

}  // namespace tp::generation
