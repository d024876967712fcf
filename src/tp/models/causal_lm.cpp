#include "tp/models/causal_lm.h"

#include <algorithm>

#include "tp/nn/decode_rows.h"
#include "tp/nn/moe.h"
#include "tp/ops/activation.h"
#include "tp/ops/router_loss.h"
#include "tp/ops/shape.h"

namespace tp {

namespace {

// One flag per token row of the decoder, in [B * T] order: a decode step's or not (nn/decode_rows.h).
std::vector<uint8_t> decode_flags(const Tensor& ids, const ForwardOptions& options) {
  if (options.segments.empty()) return std::vector<uint8_t>(static_cast<size_t>(ids.numel()), options.decode);
  std::vector<uint8_t> flags;
  for (const PackedSegment& s : options.segments) flags.insert(flags.end(), static_cast<size_t>(s.tokens), s.decode);
  return flags;
}

}  // namespace

Tensor batch_of_ids(const Tensor& ids_in, const ForwardOptions& options) {
  Tensor ids = ids_in.dim() == 1 ? ids_in.reshape({1, ids_in.size(0)}) : ids_in;
  TP_CHECK(ids.dim() == 2 && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
           "input ids must be an i64 tensor [batch, tokens], got {} {}", dtype_name(ids.dtype()),
           shape_str(ids.shape()));
  const KVState* state = options.cache;
  if (options.segments.empty()) {
    TP_CHECK(state == nullptr || state->batch() == ids.size(0), "KV state holds {} sequences, input has {}",
             state ? state->batch() : 0, ids.size(0));
    return ids;
  }
  TP_CHECK(state != nullptr && options.counts.empty(),
           "a packed forward (segments) continues rows of a KV cache: it needs `cache` and no `counts`");
  std::vector<bool> seen(static_cast<size_t>(state->batch()), false);
  int64_t tokens = 0;
  for (const PackedSegment& s : options.segments) {
    TP_CHECK(s.row >= 0 && s.row < state->batch() && s.tokens > 0,
             "packed segment (row {}, {} tokens): the row must be in [0, {}) and the tokens at least 1", s.row,
             s.tokens, state->batch());
    TP_CHECK(!seen[static_cast<size_t>(s.row)], "packed segments name cache row {} twice (one segment per row)",
             s.row);
    TP_CHECK(!s.decode || s.tokens == 1,
             "packed segment (row {}, {} tokens) is marked a decode step, which is one generated token", s.row,
             s.tokens);
    seen[static_cast<size_t>(s.row)] = true;
    tokens += s.tokens;
  }
  TP_CHECK(ids.size(0) == 1 && ids.size(1) == tokens,
           "a packed forward takes ids [1, {}] (its segments' tokens one after another), got {}", tokens,
           shape_str(ids.shape()));
  return ids;
}

Tensor token_positions(int64_t batch, int64_t tokens, const ForwardOptions& options) {
  const KVState* state = options.cache;
  std::vector<int64_t> pos(static_cast<size_t>(batch * tokens));
  if (!options.segments.empty()) {  // batch_of_ids checked: [1, N], rows of the cache
    size_t i = 0;
    for (const PackedSegment& s : options.segments)
      for (int64_t t = 0; t < s.tokens; ++t) pos.at(i++) = state->lengths()[static_cast<size_t>(s.row)] + t;
    return Tensor::from_ints(pos, {batch, tokens});
  }
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t) pos[b * tokens + t] = (state ? state->lengths()[b] : 0) + t;
  return Tensor::from_ints(pos, {batch, tokens});
}

Tensor logit_rows(const Tensor& h, const ForwardOptions& options) {
  const std::vector<int64_t>& logit_positions = options.logit_positions;
  if (logit_positions.empty()) return h;
  const int64_t B = h.size(0), T = h.size(1);
  const bool packed = !options.segments.empty();  // [1, N, H]: any number of the N tokens
  TP_CHECK(packed || static_cast<int64_t>(logit_positions.size()) == B,
           "logit_positions has {} entries for a batch of {}", logit_positions.size(), B);
  std::vector<Tensor> rows;
  for (size_t i = 0; i < logit_positions.size(); ++i) {
    TP_CHECK(logit_positions[i] >= 0 && logit_positions[i] < T, "logit position {} outside [0, {})",
             logit_positions[i], T);
    const int64_t b = packed ? 0 : static_cast<int64_t>(i);
    rows.push_back(ops::narrow(ops::narrow(h, 0, b, 1), 1, logit_positions[i], 1));
  }
  const auto n = static_cast<int64_t>(rows.size());
  return ops::reshape(rows.size() == 1 ? rows[0] : ops::cat(rows, 0), {n, -1});  // [B or len, H]
}

parallel::Plan causal_lm_plan(const ModelConfig& config, const parallel::Plan& default_base) {
  const parallel::Plan& base = config.base_model_tp_plan.empty() ? default_base : config.base_model_tp_plan;
  parallel::Plan plan;
  for (const auto& [key, style] : base) plan.emplace_back("model." + key, style);
  // A tied lm_head shares the embedding's rows: both must be vocab-parallel.
  if (config.tie_word_embeddings &&
      std::none_of(plan.begin(), plan.end(), [](const auto& e) { return e.first == "model.embed_tokens"; }))
    plan.emplace_back("model.embed_tokens", "embedding_rowwise");
  plan.emplace_back("lm_head", "colwise_gather_output");
  return plan;
}

parallel::Plan causal_lm_ep_plan(const ModelConfig& config, const parallel::Plan& default_base) {
  const parallel::Plan& base = config.base_model_ep_plan.empty() ? default_base : config.base_model_ep_plan;
  parallel::Plan plan;
  for (const auto& [key, style] : base) plan.emplace_back("model." + key, style);
  return plan;
}

std::map<std::string, std::string> tied_lm_head(const ModelConfig& config) {
  if (!config.tie_word_embeddings) return {};
  return {{"lm_head.weight", "model.embed_tokens.weight"}};
}

const nn::TensorParallelLayer* CausalLM::head_style(bool sharded_logits) {
  if (!sharded_logits) return output_embeddings().style();
  TP_CHECK(can_shard_logits_, "vocab-parallel logits need a column-parallel lm_head; this model's lm_head {}",
           output_embeddings().style() == nullptr ? "has no style" : "gathers its output under its plan");
  return vocab_parallel_head_;
}

int64_t CausalLM::logits_vocab_start(bool sharded_logits) {
  const nn::Parameter& w = output_embeddings().weight;
  return sharded_logits && head_style(true) != nullptr && !w.shard.replicated() ? w.shard.spans.at(0).offset : 0;
}

HiddenOutput CausalLM::forward_hidden(const Tensor& ids, const ForwardOptions& options) {
  const nn::DecodeRows kinds(decode_flags(ids, options));
  HiddenOutput out = run_decoder(ids, options);
  if (!options.output_router_logits || out.router_logits.empty()) return out;
  if (router_top_k_ < 0) {
    router_top_k_ = 0;
    for (nn::Module* m : modules())
      if (const auto* router = dynamic_cast<const nn::TopKRouter*>(m)) {
        router_top_k_ = router->scoring().top_k;
        break;
      }
  }
  out.aux_loss = ops::router_load_balancing_loss(out.router_logits, router_top_k_);
  return out;
}

CausalLMOutput CausalLM::forward_ids(const Tensor& ids, const ForwardOptions& options) {
  HiddenOutput decoded = forward_hidden(ids, options);
  const Tensor h = logit_rows(decoded.hidden, options);
  // Each picked row is a sequence's next token, alone or beside others': decode's kernels for every one.
  const nn::DecodeRows kinds(std::vector<uint8_t>(static_cast<size_t>(h.numel() / h.size(-1)),
                                                  !options.logit_positions.empty()));
  Tensor logits = output_embeddings().call_with_style({h}, head_style(options.sharded_logits));
  if (final_logit_softcapping_ > 0) logits = ops::softcap(logits, final_logit_softcapping_);
  return {.logits = logits,
          .vocab_start = logits_vocab_start(options.sharded_logits),
          .router_logits = std::move(decoded.router_logits),
          .aux_loss = decoded.aux_loss};
}

}  // namespace tp
