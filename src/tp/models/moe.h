#pragma once
// The sparse mixture-of-experts block shared by the MoE architectures (Mixtral,
// Qwen3-MoE; DeepSeek later adds shared experts and other router scoring):
//
//   routing = gate(x)                    top-k experts per token and their weights
//   out     = experts(x, routing)        sum_k w_k * SwiGLU expert_k(x), grouped by expert
//
// and the config keys that size it. x [B, T, H] is flattened to N = B*T tokens.
#include <cstdint>
#include <string>
#include <vector>

#include "tp/models/config.h"
#include "tp/nn/moe.h"

namespace tp {

// The MoE keys of config.json (Mixtral: num_local_experts, intermediate_size per
// expert; Qwen3-MoE: num_experts, moe_intermediate_size, norm_topk_prob,
// decoder_sparse_step, mlp_only_layers).
struct MoeConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;               // num_experts_per_tok
  int64_t expert_intermediate = 0;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.001;  // Transformers' default for both
  bool output_router_logits = false;

  // Errors name the file and the key.
  static MoeConfig from(const ModelConfig& config);
  // Qwen3-MoE's rule (Mixtral: every layer): layer i is sparse unless listed in
  // mlp_only_layers, and when (i + 1) % decoder_sparse_step == 0.
  bool is_sparse_layer(int64_t layer) const;
};

class SparseMoeBlock : public nn::Module {
 public:
  SparseMoeBlock(const std::string& name, int64_t hidden, const MoeConfig& moe);
  nn::TopKRouter& gate;
  nn::MoeExperts& experts;

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;  // x [B, T, H] -> [B, T, H]
};

}  // namespace tp
