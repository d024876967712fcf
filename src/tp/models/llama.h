#pragma once
// The Llama decoder family (Llama 2/3, Mistral, Qwen3), read top to bottom like
// Transformers' modeling_llama.py. Qwen3 differs only by per-head q_norm/k_norm
// before RoPE; Mistral by its sliding window. Member names are checkpoint keys,
// and no code here knows about tensor parallelism: head counts are read off the
// local weight shapes, and the plan's hooks do the communication.
//
// B = batch, T = tokens, H = hidden_size, D = head_dim, V = vocab_size.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tp/models/causal_lm.h"
#include "tp/models/decoder_args.h"
#include "tp/models/decoder_model.h"
#include "tp/nn/fused_linears.h"
#include "tp/nn/layers.h"
#include "tp/ops/rope.h"

namespace tp {

struct LlamaVariant {
  bool qk_norm = false;  // Qwen3
  // Mistral: every layer's window (0: none). With `layer_types` in config.json
  // (GPT-OSS style), only the "sliding_attention" layers use it.
  int64_t sliding_window = 0;
  // Without `layer_types`, layers below this index keep full attention (Qwen3's
  // max_window_layers); the rest use sliding_window.
  int64_t full_attention_layers = 0;
  bool mlp_bias = false;  // Llama's mlp_bias: biases on gate_proj, up_proj and down_proj
  // Biases on q/k/v and on o_proj: config.json's attention_bias unless the
  // architecture fixes them (Mistral: none; Qwen2: on q, k and v only).
  std::optional<bool> qkv_bias, o_bias;
  // GPT-OSS: one learned sink logit per query head (self_attn.sinks [Hq]) joins
  // every softmax's denominator.
  bool attention_sinks = false;
  parallel::Plan default_plan;     // used when config.json carries no base_model_tp_plan
  parallel::Plan default_ep_plan;  // used when config.json carries no base_model_ep_plan (MoE models)
  // The feed-forward block of layer i (named `name`, i.e. "...layers.i.mlp");
  // null (or returning null for a layer): the dense LlamaMLP. MoE architectures return their sparse block here.
  std::function<std::unique_ptr<nn::Module>(const std::string& name, int64_t layer, const ModelConfig&)> make_mlp;
  CheckpointNames checkpoint_names;  // where the Hub's names differ from the tree's (MoE experts)
  std::vector<std::string> lora_targets;  // PEFT's default target_modules (empty: none)
};

class LlamaAttention : public nn::Module {
 public:
  LlamaAttention(const std::string& name, const ModelConfig& c, const LlamaVariant& v);
  nn::Linear& q_proj;
  nn::Linear& k_proj;
  nn::Linear& v_proj;
  nn::Linear& o_proj;
  nn::RMSNorm* q_norm = nullptr;
  nn::RMSNorm* k_norm = nullptr;
  nn::Parameter* sinks = nullptr;  // [Hq] (this rank's heads), GPT-OSS
  int64_t layer_index;
  int64_t sliding_window = 0;  // this layer's: keys in (p - window, p]; 0: full attention
  // q, k and v all take a bf16 input as is (see nn::Linear::takes_bf16_input).
  bool takes_bf16_input() const;

  // Inference: q|k|v packed as one GEMM (nn::FusedLinears) when their styles allow.
  bool fuses_children() const override { return true; }
  void finalize_weights(bool inference_only) override;
  void release_packed_weights() override { qkv_.release(); }

 protected:
  // x [B, T, H] -> [B, T, H] at the call's positions (DecoderArgs), continuing its cache if any.
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: attention needs DecoderArgs

 private:
  int64_t head_dim_;
  double scale_;
  nn::FusedLinears qkv_;
};

class LlamaMLP : public nn::Module {
 public:
  // intermediate < 0: the config's intermediate_size (DeepSeek's shared experts give their own).
  LlamaMLP(const std::string& name, const ModelConfig& c, int64_t intermediate = -1, bool bias = false);
  nn::Linear& gate_proj;
  nn::Linear& up_proj;
  nn::Linear& down_proj;
  bool takes_bf16_input() const { return gate_proj.takes_bf16_input() && up_proj.takes_bf16_input(); }

  // Inference: gate|up packed as one GEMM (nn::FusedLinears) when their styles allow.
  bool fuses_children() const override { return true; }
  void finalize_weights(bool inference_only) override;
  void release_packed_weights() override { gate_up_.release(); }

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;  // down(silu(gate(x)) * up(x))

 private:
  LlamaMLP(const std::string& name, int64_t hidden, int64_t intermediate, bool bias);  // the sizes resolved
  nn::FusedLinears gate_up_;
};

class LlamaDecoderLayer : public nn::Module {
 public:
  LlamaDecoderLayer(const std::string& name, int64_t index, const ModelConfig& c, const LlamaVariant& v);
  nn::RMSNorm& input_layernorm;
  LlamaAttention& self_attn;
  nn::RMSNorm& post_attention_layernorm;
  nn::Module& mlp;  // LlamaMLP, or the variant's block (a sparse MoE block)

 protected:
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: the attention needs DecoderArgs

 private:
  bool differentiable(const Tensor& x);
};

using LlamaModel = DecoderModel<LlamaDecoderLayer, LlamaVariant>;

class LlamaForCausalLM : public CausalLM {
 public:
  LlamaForCausalLM(const ModelConfig& config, LlamaVariant variant);
  LlamaModel& model;
  nn::Linear& lm_head;

  parallel::Plan shipped_plan() const override;
  parallel::Plan shipped_ep_plan() const override;
  parallel::Plan sequence_parallel_plan() const override;
  parallel::StyleOverrides check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const override;
  std::map<std::string, std::string> tied_parameters() const override;
  CheckpointNames checkpoint_names() const override { return variant_.checkpoint_names; }
  std::vector<std::string> default_lora_targets() const override { return variant_.lora_targets; }
  KVState make_kv_state(int64_t batch, int64_t max_len) const override;
  nn::Linear& output_embeddings() override { return lm_head; }

 protected:
  HiddenOutput run_decoder(const Tensor& ids, const ForwardOptions& options) override;

 private:
  LlamaVariant variant_;
  std::vector<float> inv_freq_;
  ops::RopeOptions rope_options_;
};

// The Llama plan as Transformers ships it (keys without the "model." prefix).
parallel::Plan llama_base_tp_plan();

// check_tp's head checks for one attention's projections: colwise q needs whole
// heads per rank; colwise k / v too, or KV heads replicated over tp_size / kv
// ranks (added to `overrides`) when tp_size is a multiple of them.
struct AttentionProjections {
  const nn::Linear* q;
  const nn::Linear* k;
  const nn::Linear* v;
};
void check_attention_heads(const ModelConfig& c, const AttentionProjections& qkv,
                           const std::function<std::string(const std::string&)>& style_of, int64_t tp_size,
                           parallel::StyleOverrides& overrides);

}  // namespace tp
