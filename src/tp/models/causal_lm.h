#pragma once
// The interface every architecture implements: a module tree named like the
// checkpoint, the plan it ships, the size checks it needs before loading, and
// a forward from token ids to logits.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tp/models/checkpoint_names.h"
#include "tp/models/config.h"
#include "tp/models/gradient_checkpointing.h"
#include "tp/models/unit_hooks.h"
#include "tp/nn/layers.h"
#include "tp/nn/module.h"
#include "tp/ops/attention.h"
#include "tp/parallel/apply.h"
#include "tp/parallel/plan.h"

namespace tp {

// Per-request decoding state: one KV cache per layer, sized for this rank's heads.
struct KVState {
  std::vector<ops::KVCache> layers;
  int64_t batch() const { return layers.empty() ? 0 : layers[0].lengths().size(); }
  const std::vector<int64_t>& lengths() const { return layers.at(0).lengths(); }

  // Sequence slots of a server (tp/serving): row `row` of every layer starts over.
  void reset(int64_t row) {
    for (ops::KVCache& c : layers) c.reset(row);
  }
  // Rows [first, first + count) of every layer as a state of their own (same
  // memory): a forward on it touches only these rows; take_lengths() commits it.
  KVState rows(int64_t first, int64_t count) const {
    KVState view;
    for (const ops::KVCache& c : layers) view.layers.push_back(c.rows(first, count));
    return view;
  }
  void take_lengths(const KVState& rows, int64_t first) {
    TP_CHECK(rows.layers.size() == layers.size(), "KVState::take_lengths: {} layers for {}", rows.layers.size(),
             layers.size());
    for (size_t i = 0; i < layers.size(); ++i) layers[i].take_lengths(rows.layers[i], first);
  }
};

// One sequence's part of a packed forward (ForwardOptions::segments): the next
// `tokens` tokens of cache row `row`.
struct PackedSegment {
  int64_t row = 0;
  int64_t tokens = 0;
  bool decode = false;  // one token the model generated (a decode step), not a prompt's (nn/decode_rows.h)
};

// What one forward is asked for (Transformers' forward arguments, explicit).
struct ForwardOptions {
  // Continue each cached sequence: row b appends counts[b] tokens (default: all
  // T), and the caches grow. Null: a fresh forward over the whole ids.
  KVState* cache = nullptr;
  std::vector<int64_t> counts;
  // One per row: only that position's logits ([B, V]); empty: every position.
  // Packed (segments): any number of indices into the N tokens, logits [len, V].
  std::vector<int64_t> logit_positions;
  // A packed forward (a server's step): ids [1, N] are these segments' tokens one
  // after another, each segment continuing its own row of `cache` (no row twice;
  // counts empty). Each token gets its row's next position and attends over its
  // row alone; everything else (embedding, norms, GEMMs, experts, lm_head) runs
  // once over the N tokens, so each weight is read once for every sequence of the
  // step. Rows not named are neither read nor written.
  std::vector<PackedSegment> segments;
  // Unpacked: every token is a decode step, each row's newest generated token (generate's steps after the
  // prompt). With it, and PackedSegment::decode, each token's products take the kernels of its kind however many
  // tokens share them (nn/decode_rows.h), so a sequence's bits are the same alone and in any batch; logit rows
  // picked by logit_positions count as decode rows in lm_head.
  bool decode = false;
  // Vocab-parallel logits: lm_head keeps this rank's vocabulary slice instead
  // of all-gathering it (the loss-parallel loss, greedy argmax over shards).
  // Possible when lm_head is column-parallel (CausalLM::can_shard_logits).
  bool sharded_logits = false;
  // Return each MoE router's logits (Transformers' output_router_logits), for
  // the auxiliary load-balancing loss.
  bool output_router_logits = false;
};

// What one forward computed.
struct CausalLMOutput {
  Tensor logits;            // f32 [B, T, V] or [B, V]; sharded: this rank's [.., V_local]
  int64_t vocab_start = 0;  // the vocabulary id of logits' first column (0 unless sharded)
  // Asked for: [B * T, E] f32 per sparse layer, in layer order (differentiable),
  // and their load-balancing loss (Transformers' aux_loss, ops/router_loss.h;
  // undefined for a model without routers). The caller scales it by router_aux_loss_coef.
  std::vector<Tensor> router_logits;
  Tensor aux_loss;
};

// The decoder's part of a forward: its last hidden states (after the final
// norm, what lm_head reads) and, when asked, the routers' logits.
struct HiddenOutput {
  Tensor hidden;  // [B, T, H]
  std::vector<Tensor> router_logits;
  Tensor aux_loss;
};

class CausalLM : public nn::Module {
 public:
  explicit CausalLM(const ModelConfig& config) : nn::Module(""), config_(config) {}
  const ModelConfig& config() const { return config_; }

  // The architecture's base_model_tp_plan (keys under "model.") plus
  // lm_head: colwise_gather_output; a tied model's embedding is vocab-parallel.
  virtual parallel::Plan shipped_plan() const = 0;
  // The architecture's base_model_ep_plan (keys under "model."), applied when
  // ep_size > 1; empty: the model has no experts to split.
  virtual parallel::Plan shipped_ep_plan() const { return {}; }
  // Entries merged over the shipped plan under sequence parallelism
  // (tp/parallel/sequence.h): the modules that run on sequence shards, the blocks
  // that all-gather the sequence on entry. Empty: the architecture has no
  // sequence-parallel layout.
  virtual parallel::Plan sequence_parallel_plan() const { return {}; }
  // Size checks the plan needs (heads, kv heads, intermediate size ...) before any
  // weight is read; returns the style overrides the model needs (e.g. KV-head
  // replication when tp_size > num_key_value_heads).
  virtual parallel::StyleOverrides check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const = 0;
  // Parameters stored under another name in the checkpoint (tied weights): name -> source.
  virtual std::map<std::string, std::string> tied_parameters() const { return {}; }
  // Where the Hub's checkpoint names differ from the tree's (tp/models/layout.h).
  virtual CheckpointNames checkpoint_names() const { return {}; }
  // LoRA's target_modules when a config names none: PEFT's default for the
  // architecture (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING); empty: none.
  virtual std::vector<std::string> default_lora_targets() const { return {}; }

  // Activation checkpointing of the decoder layers in training (off by default).
  void set_gradient_checkpointing(const GradientCheckpointing& c) { checkpointing_ = c; }
  const GradientCheckpointing& gradient_checkpointing() const { return checkpointing_; }
  // Hooks the decoder calls around its parameter units (FSDP); null: none.
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }

  // Fresh KV caches for `batch` sequences of up to `max_len` tokens.
  virtual KVState make_kv_state(int64_t batch, int64_t max_len) const = 0;

  // ids [B, T] (i64) -> logits as `options` ask (see ForwardOptions).
  CausalLMOutput forward_ids(const Tensor& ids, const ForwardOptions& options = {});
  // The decoder alone: ids [B, T] (or [T]) -> its last hidden states, with the
  // cache, counts and router logits (and their aux loss) `options` ask for
  // (their logit options unused).
  HiddenOutput forward_hidden(const Tensor& ids, const ForwardOptions& options = {});
  // lm_head (Transformers' get_output_embeddings).
  virtual nn::Linear& output_embeddings() = 0;
  // Logits soft-capped after lm_head, cap * tanh(logits / cap) (Gemma's
  // final_logit_softcapping; elementwise, so sharded logits too); 0: none.
  // A loss that runs lm_head's GEMM itself must not skip it.
  double final_logit_softcapping() const { return final_logit_softcapping_; }

  // Whether a forward may ask for sharded_logits, and the style lm_head then
  // runs under (its planned column split without the all-gather; null with one
  // rank): the loader sets them once it has applied the plan.
  void set_vocab_parallel_head(bool possible, const nn::TensorParallelLayer* style) {
    can_shard_logits_ = possible;
    vocab_parallel_head_ = style;
  }
  bool can_shard_logits() const { return can_shard_logits_; }
  // The style lm_head's input goes through in a forward so asked (for a loss
  // that runs lm_head's GEMM itself).
  const nn::TensorParallelLayer* head_style(bool sharded_logits);
  // The vocabulary id of the first logit a forward so asked returns on this rank.
  int64_t logits_vocab_start(bool sharded_logits);

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override {
    TP_CHECK(inputs.size() == 1, "a causal LM takes one input (token ids), got {}", inputs.size());
    return forward_ids(inputs[0]).logits;
  }
  // The architecture's decoder: forward_hidden without the aux loss.
  virtual HiddenOutput run_decoder(const Tensor& ids, const ForwardOptions& options) = 0;
  ModelConfig config_;
  GradientCheckpointing checkpointing_;  // the decoder reads it (DecoderModel::checkpointing)
  UnitHooks* unit_hooks_ = nullptr;      // and this (DecoderModel::unit_hooks)
  double final_logit_softcapping_ = 0;   // set by an architecture that caps its logits

 private:
  bool can_shard_logits_ = false;
  const nn::TensorParallelLayer* vocab_parallel_head_ = nullptr;
  int64_t router_top_k_ = -1;  // the routers' top_k, looked up on first use (0: no router)
};

// Pieces every architecture's forward_ids and shipped_plan share (causal_lm.cpp).

// ids [T] or [B, T] (i64/i32) as [B, T], checked against `options`: the cache,
// when given, holds B sequences, or, packed, ids are [1, N] with N the segments'
// tokens, each segment on a distinct row of the cache.
Tensor batch_of_ids(const Tensor& ids, const ForwardOptions& options);
// Positions [B, T] (i64) of the new tokens: row b continues its cached sequence;
// packed ([1, N]): each segment's tokens continue its row.
Tensor token_positions(int64_t batch, int64_t tokens, const ForwardOptions& options);
// h [B, T, H] -> [B, H], row b at logit_positions[b]; packed: h [1, N, H] ->
// [len, H], the tokens at logit_positions; empty: h as it is.
Tensor logit_rows(const Tensor& h, const ForwardOptions& options);
// config.json's base_model_tp_plan (or `default_base` when it has none) under
// "model.", the embedding vocab-parallel when lm_head is tied to it, and
// lm_head: colwise_gather_output.
parallel::Plan causal_lm_plan(const ModelConfig& config, const parallel::Plan& default_base);
// config.json's base_model_ep_plan (or `default_base`) under "model.".
parallel::Plan causal_lm_ep_plan(const ModelConfig& config, const parallel::Plan& default_base);
// lm_head.weight -> model.embed_tokens.weight when the config ties them, else nothing.
std::map<std::string, std::string> tied_lm_head(const ModelConfig& config);

}  // namespace tp
