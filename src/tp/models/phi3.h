#pragma once
// Phi-3 / Phi-3.5 (model_type "phi3"), read like Transformers' modeling_phi3.py:
// the Llama decoder with q|k|v fused into one qkv_proj and gate|up into one
// gate_up_proj, partial rotary dims (partial_rotary_factor) and LongRoPE, whose
// frequencies change with the longest position a forward reaches.
//
// Transformers' plan gathers the fused outputs on every rank (colwise_rep) and
// splits the next projection's input locally (rowwise_rep): a contiguous cut of
// q|k|v would not be whole heads. So every rank computes all heads' attention
// and keeps all KV heads in its cache; the projections' GEMMs are what is split.
//
// B = batch, T = tokens, H = hidden_size, D = head_dim, I = intermediate_size.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tp/models/causal_lm.h"
#include "tp/models/decoder_args.h"
#include "tp/models/decoder_model.h"
#include "tp/models/rope_config.h"
#include "tp/nn/layers.h"

namespace tp {

struct Phi3Options {
  int64_t sliding_window = 0;  // config.json's sliding_window, on every layer (0: none)
};

class Phi3Attention : public nn::Module {
 public:
  Phi3Attention(const std::string& name, const ModelConfig& c, int64_t layer_index, const Phi3Options& o);
  nn::Linear& qkv_proj;  // H -> (Hq + 2 Hkv) D, q then k then v
  nn::Linear& o_proj;
  int64_t layer_index;
  int64_t sliding_window;

 protected:
  // x [B, T, H] -> [B, T, H] at the call's positions (DecoderArgs), continuing its cache if any.
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: attention needs DecoderArgs

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double scale_;
};

class Phi3MLP : public nn::Module {
 public:
  Phi3MLP(const std::string& name, const ModelConfig& c);
  nn::Linear& gate_up_proj;  // H -> 2I: gate then up
  nn::Linear& down_proj;

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;  // down(up * silu(gate))
};

class Phi3DecoderLayer : public nn::Module {
 public:
  Phi3DecoderLayer(const std::string& name, int64_t index, const ModelConfig& c, const Phi3Options& o);
  nn::RMSNorm& input_layernorm;
  Phi3Attention& self_attn;
  nn::RMSNorm& post_attention_layernorm;
  Phi3MLP& mlp;

 protected:
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: the attention needs DecoderArgs
};

using Phi3Model = DecoderModel<Phi3DecoderLayer, Phi3Options>;

class Phi3ForCausalLM : public CausalLM {
 public:
  explicit Phi3ForCausalLM(const ModelConfig& config);
  Phi3Model& model;
  nn::Linear& lm_head;

  parallel::Plan shipped_plan() const override;
  parallel::StyleOverrides check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const override;
  std::map<std::string, std::string> tied_parameters() const override;
  std::vector<std::string> default_lora_targets() const override { return {"qkv_proj"}; }  // PEFT's for phi3
  KVState make_kv_state(int64_t batch, int64_t max_len) const override;
  nn::Linear& output_embeddings() override { return lm_head; }

  // The rotary dims: int(head_dim * partial_rotary_factor).
  int64_t rotary_dim() const { return rotary_dim_; }
  // The frequencies a forward whose largest position is seq_len - 1 uses.
  const std::vector<float>& inv_freq_for(int64_t seq_len) const;

 protected:
  HiddenOutput run_decoder(const Tensor& ids, const ForwardOptions& options) override;

 private:
  int64_t rotary_dim_;
  std::vector<float> inv_freq_;     // rope_type "default"
  std::optional<LongRope> longrope_;  // rope_type "longrope"
  ops::RopeOptions rope_options_;
};

// Transformers' base_model_tp_plan for phi3 (keys without the "model." prefix).
parallel::Plan phi3_base_tp_plan();

}  // namespace tp
