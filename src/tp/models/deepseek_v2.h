#pragma once
// DeepSeek-V2 and V3: the Llama decoder with multi-head latent attention (MLA)
// and, from layer first_k_dense_replace on, the sparse MoE block with shared
// experts (tp/models/moe.h), read like Transformers' modeling_deepseek_v2.py /
// _v3.py. V3 differs in its router (sigmoid, e_score_correction_bias, noaux_tc:
// deepseek_config.h), its RoPE order (rope_interleave) and its plan (attention
// replicated). Member names are checkpoint keys; no code here knows about tensor
// parallelism (heads are read off local shapes).
//
// B = batch, T = new tokens, L = keys (cached + new), h = this rank's heads,
// H = hidden_size, C = kv_lora_rank, N = qk_nope_head_dim, R = qk_rope_head_dim,
// V = v_head_dim.
#include <memory>
#include <string>
#include <vector>

#include "tp/models/causal_lm.h"
#include "tp/models/decoder_model.h"
#include "tp/models/deepseek_config.h"
#include "tp/models/llama.h"
#include "tp/models/moe.h"
#include "tp/nn/layers.h"
#include "tp/ops/rope.h"

namespace tp {

// What every layer's MLA shares: the rope and the softmax scale.
struct MlaRope {
  std::vector<float> inv_freq;  // R / 2 frequencies (yarn-scaled when the config says so)
  ops::RopeOptions options;     // interleaved pairs, yarn's attention factor on cos and sin
  double scale = 0;             // qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under yarn
};
MlaRope mla_rope(const ModelConfig& c, const DeepseekSizes& s);

// Multi-head latent attention:
//   q        = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x)))     [B, T, h, N + R]
//   latent   = kv_a_layernorm(kv_a_proj_with_mqa(x)[..., :C])           [B, T, C]
//   k_pe     = rope(kv_a_proj_with_mqa(x)[..., C:])                     [B, T, 1, R], shared by all heads
//   k_nope|v = kv_b_proj(latent)                                        [B, L, h, N + V]
//   out      = o_proj(softmax(scale [q_nope | rope(q_pe)] . [k_nope | k_pe]) v)
// The KV cache holds latent (as its "keys", one head of C) and k_pe (its
// "values", one head of R): C + R numbers per token instead of h (2N + R + V).
// Each step re-expands the cached latents through kv_b_proj: the same
// arithmetic as without a cache (exact), at the cost of a [L, C] x [C, h(N + V)]
// GEMM per step; absorbing kv_b_proj into the query would save that but round
// differently.
class DeepseekV2Attention : public nn::Module {
 public:
  DeepseekV2Attention(const std::string& name, const ModelConfig& c, const DeepseekSizes& s);
  nn::Linear* q_proj = nullptr;  // without q_lora_rank
  nn::Linear* q_a_proj = nullptr;  // with q_lora_rank: q_a_proj -> q_a_layernorm -> q_b_proj
  nn::RMSNorm* q_a_layernorm = nullptr;
  nn::Linear* q_b_proj = nullptr;
  nn::Linear* kv_a_proj_with_mqa = nullptr;
  nn::RMSNorm* kv_a_layernorm = nullptr;
  nn::Linear* kv_b_proj = nullptr;
  nn::Linear* o_proj = nullptr;
  int64_t layer_index = 0;
  const MlaRope* rope = nullptr;

 protected:
  // x [B, T, H] -> [B, T, H] at the call's positions (DecoderArgs), continuing its cache if any.
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: attention needs DecoderArgs

 private:
  DeepseekSizes sizes_;
};

class DeepseekV2DecoderLayer : public nn::Module {
 public:
  DeepseekV2DecoderLayer(const std::string& name, int64_t index, const ModelConfig& c, const DeepseekSizes& s);
  nn::RMSNorm& input_layernorm;
  DeepseekV2Attention& self_attn;
  nn::RMSNorm& post_attention_layernorm;
  nn::Module& mlp;                 // one of:
  LlamaMLP* dense = nullptr;       // layers < first_k_dense_replace
  SparseMoeBlock* moe = nullptr;   // the others (with n_routed_experts > 0)

 protected:
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;
  Tensor forward(const std::vector<Tensor>& inputs) override;  // an error: the attention needs DecoderArgs
};

using DeepseekV2Model = DecoderModel<DeepseekV2DecoderLayer, DeepseekSizes>;

class DeepseekV2ForCausalLM : public CausalLM {
 public:
  explicit DeepseekV2ForCausalLM(const ModelConfig& config);
  DeepseekV2Model& model;
  nn::Linear& lm_head;

  parallel::Plan shipped_plan() const override;
  parallel::Plan shipped_ep_plan() const override;
  parallel::StyleOverrides check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const override;
  std::map<std::string, std::string> tied_parameters() const override;
  // The experts per expert under mlp.experts.E.{gate,up,down}_proj, as Qwen3-MoE's.
  CheckpointNames checkpoint_names() const override { return {.experts = &kNamings[1]}; }
  KVState make_kv_state(int64_t batch, int64_t max_len) const override;
  nn::Linear& output_embeddings() override { return lm_head; }

 protected:
  HiddenOutput run_decoder(const Tensor& ids, const ForwardOptions& options) override;

 private:
  DeepseekSizes sizes_;
  MlaRope rope_;
};

// Transformers' base_model_tp_plan (keys without "model."). V2: q_proj or q_b_proj
// colwise (whichever the config has), kv_a_proj_with_mqa mla_kv_a_proj, kv_b_proj
// colwise, o_proj rowwise; V3: no attention entries (replicated). Both: the dense
// MLP and the shared experts colwise / colwise / rowwise, the experts as Mixtral's.
parallel::Plan deepseek_base_tp_plan(const DeepseekSizes& s);
// base_model_ep_plan: masked expert parallelism (ep_router, grouped_gemm, moe_tp_experts).
parallel::Plan deepseek_base_ep_plan();

}  // namespace tp
