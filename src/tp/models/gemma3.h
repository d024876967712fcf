#pragma once
// Gemma 3's text decoder (Gemma3ForCausalLM, model_type "gemma3_text"), read top
// to bottom like Transformers' modeling_gemma3.py. Against Llama:
//   - embed_tokens' output times sqrt(hidden_size) (the factor in the weights' dtype);
//   - every RMSNorm is (1 + w) * x / rms(x) in f32, its weight stored as w;
//   - sandwich norms: h = x + post_attention_layernorm(attn(input_layernorm(x))),
//     out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
//   - per-head q_norm / k_norm before RoPE; scores scaled by query_pre_attn_scalar^-0.5;
//   - GeGLU MLP: down(gelu_tanh(gate(x)) * up(x));
//   - "sliding_attention" layers (window sliding_window, RoPE base rope_local_base_freq,
//     no scaling) and "full_attention" ones (rope_theta with rope_scaling), from
//     layer_types or, without it, every sliding_window_pattern-th layer global;
//   - logits soft-capped by final_logit_softcapping when set. attn_logit_softcapping
//     is read by Transformers' Gemma3Attention but never applied (Gemma 2 applied it).
// Member names are checkpoint keys; no code here knows about tensor parallelism.
//
// B = batch, T = tokens, H = hidden_size, D = head_dim.
#include <memory>
#include <string>
#include <vector>

#include "tp/models/causal_lm.h"
#include "tp/models/decoder_model.h"
#include "tp/nn/layers.h"

namespace tp {

// Gemma3ForConditionalGeneration's config.json (model_type "gemma3"): whether
// `raw` is one, and its language model's config as a gemma3_text config.json:
// text_config with Gemma3TextConfig's defaults for the size keys it leaves out
// (the Hub's gemma-3-4b lists few), and the top level's dtype and token ids.
bool is_gemma3_multimodal(const nlohmann::json& raw);
nlohmann::json gemma3_text_config_of(const nlohmann::json& raw);

// What the layers read off the config once: each layer's window and rope.
struct Gemma3Layers {
  std::vector<int64_t> window;   // per layer: 0 (full attention) or sliding_window
  std::vector<float> global_inv_freq, local_inv_freq;
  double scale = 0;              // query_pre_attn_scalar^-0.5
  bool geglu_tanh = true;        // hidden_activation gelu_pytorch_tanh (else exact gelu)
};
Gemma3Layers gemma3_layers(const ModelConfig& c);

class Gemma3Attention : public nn::Module {
 public:
  // Keeps a pointer to g's rope table for its kind: g outlives it (Gemma3ForCausalLM holds it).
  Gemma3Attention(const std::string& name, int64_t index, const ModelConfig& c, const Gemma3Layers& g);
  nn::Linear& q_proj;
  nn::Linear& k_proj;
  nn::Linear& v_proj;
  nn::Linear& o_proj;
  nn::RMSNorm& q_norm;
  nn::RMSNorm& k_norm;
  int64_t layer_index;
  int64_t sliding_window;  // keys in (p - window, p]; 0: full attention

 protected:
  // x [B, T, H] -> [B, T, H] at the call's positions (DecoderArgs), continuing its cache if any.
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: attention needs DecoderArgs

 private:
  int64_t head_dim_;
  double scale_;
  const std::vector<float>* inv_freq_;  // this layer's: local or global
};

class Gemma3MLP : public nn::Module {
 public:
  Gemma3MLP(const std::string& name, const ModelConfig& c, bool gelu_tanh);
  nn::Linear& gate_proj;
  nn::Linear& up_proj;
  nn::Linear& down_proj;

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;  // down(gelu(gate(x)) * up(x))

 private:
  bool gelu_tanh_;
};

class Gemma3DecoderLayer : public nn::Module {
 public:
  Gemma3DecoderLayer(const std::string& name, int64_t index, const ModelConfig& c, const Gemma3Layers& g);
  nn::RMSNorm& input_layernorm;
  Gemma3Attention& self_attn;
  nn::RMSNorm& post_attention_layernorm;
  nn::RMSNorm& pre_feedforward_layernorm;
  Gemma3MLP& mlp;
  nn::RMSNorm& post_feedforward_layernorm;

 protected:
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: the attention needs DecoderArgs
};

using Gemma3TextModel = DecoderModel<Gemma3DecoderLayer, Gemma3Layers>;

class Gemma3ForCausalLM : public CausalLM {
  Gemma3Layers layers_;  // read off the config before the tree that points into it

 public:
  explicit Gemma3ForCausalLM(const ModelConfig& config);
  Gemma3TextModel& model;
  nn::Linear& lm_head;

  parallel::Plan shipped_plan() const override;
  parallel::Plan sequence_parallel_plan() const override;
  parallel::StyleOverrides check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const override;
  std::map<std::string, std::string> tied_parameters() const override { return tied_lm_head(config_); }
  std::vector<std::string> default_lora_targets() const override { return {"q_proj", "v_proj"}; }
  KVState make_kv_state(int64_t batch, int64_t max_len) const override;
  nn::Linear& output_embeddings() override { return lm_head; }

 protected:
  HiddenOutput run_decoder(const Tensor& ids, const ForwardOptions& options) override;
};

}  // namespace tp
