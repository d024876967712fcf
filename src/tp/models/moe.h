#pragma once
// The sparse mixture-of-experts block shared by the MoE architectures (Mixtral,
// Qwen3-MoE, DeepSeek-V2/V3):
//
//   weights, ids = gate.route(x)         top-k experts per token and their weights
//   out     = experts(x, weights, ids)   sum_k w_k * SwiGLU expert_k(x), grouped by expert
//           + shared_experts(x)          DeepSeek: one SwiGLU MLP every token takes, unweighted
//
// and the config keys that size it. x [B, T, H] is flattened to N = B*T tokens.
// GPT-OSS names its router mlp.router (the member is `gate` all the same).
#include <cstdint>
#include <string>
#include <vector>

#include "tp/models/config.h"
#include "tp/models/llama.h"
#include "tp/nn/moe.h"

namespace tp {

// The MoE keys of config.json (Mixtral: num_local_experts, intermediate_size per
// expert; Qwen3-MoE: num_experts, moe_intermediate_size, norm_topk_prob,
// decoder_sparse_step, mlp_only_layers; GPT-OSS: num_local_experts,
// intermediate_size, swiglu_limit, a router `mlp.router` with a bias; DeepSeek:
// deepseek_moe_config).
// What an architecture's config.json calls its MoE keys (Qwen3-MoE's names by default).
struct MoeKeys {
  const char* num_experts = "num_experts";                    // Mixtral, GPT-OSS: num_local_experts
  const char* expert_intermediate = "moe_intermediate_size";  // Mixtral, GPT-OSS: intermediate_size
  // Mixtral, GPT-OSS: the top-k weights always renormalised; else under norm_topk_prob (default false).
  bool always_renormalize = false;
  // Qwen3-MoE: decoder_sparse_step and mlp_only_layers choose the sparse layers (else every layer is).
  bool sparse_layer_keys = true;
  // GPT-OSS: a router `mlp.router` with a bias, top-k then softmax, swiglu_limit.
  bool gpt_oss = false;
};

struct MoeConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;               // num_experts_per_tok
  int64_t expert_intermediate = 0;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.001;  // Transformers' default for both
  bool output_router_logits = false;
  std::string router_name = "gate";  // GPT-OSS: "router"
  bool gpt_oss = false;              // router top-k then softmax with a bias; GPT-OSS's experts (nn::ExpertLayout)
  double swiglu_limit = 7.0;
  // The router's whole scoring (its top_k and renormalize are the two above);
  // DeepSeek's add grouped choice, sigmoid scores and routed_scaling_factor.
  nn::RouterScoring scoring;
  bool score_correction_bias = false;  // DeepSeek-V3's mlp.gate.e_score_correction_bias
  int64_t shared_intermediate = 0;     // DeepSeek: moe_intermediate_size x n_shared_experts (0: none)

  // Errors name the file and the key. (DeepSeek's: deepseek_moe_config.)
  static MoeConfig from(const ModelConfig& config, const MoeKeys& keys);
  // Qwen3-MoE's rule (Mixtral: every layer): layer i is sparse unless listed in
  // mlp_only_layers, and when (i + 1) % decoder_sparse_step == 0.
  bool is_sparse_layer(int64_t layer) const;
};

// The experts' entries of the MoE models' base_model_tp_plan (mixtral.cpp):
// gate_up_proj packed_colwise, down_proj rowwise, experts moe_tp_experts.
parallel::Plan moe_experts_tp_plan();

class SparseMoeBlock : public nn::Module {
 public:
  SparseMoeBlock(const std::string& name, const ModelConfig& c, const MoeConfig& moe);
  const MoeConfig& moe_config() const { return moe_; }
  nn::TopKRouter& gate;
  nn::MoeExperts& experts;
  LlamaMLP* shared_experts = nullptr;  // DeepSeek

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;  // x [B, T, H] -> [B, T, H]
  // The same, the router's logits collected where the call's arguments ask (nn::RouterLogitsArgs).
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) override;

 private:
  Tensor run(const Tensor& x, const nn::ForwardArgs* args);
  MoeConfig moe_;
};

}  // namespace tp
