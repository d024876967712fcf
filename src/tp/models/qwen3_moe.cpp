// Qwen3-MoE: Qwen3's decoder (per-head q_norm/k_norm) with a sparse MoE block
// on the layers decoder_sparse_step and mlp_only_layers select (the others keep
// a dense MLP of intermediate_size); router weights renormalised only with
// norm_topk_prob; under use_sliding_window, a sliding window on every layer.
// Expert parallelism by token dispatch, as Transformers ships it since v5.19:
// each rank owns E / ep_size experts and the tokens travel to them (two
// all-to-alls per layer).
#include "tp/models/moe.h"
#include "tp/models/variants.h"

namespace tp {

LlamaVariant qwen3_moe_variant(const ModelConfig& config) {
  LlamaVariant v = qwen3_decoder_variant();
  // Qwen3MoeConfig keeps the window under use_sliding_window and applies it on every layer
  // (max_window_layers is stored, not read).
  qwen_sliding_window(config, v, false);
  for (auto& entry : moe_experts_tp_plan()) v.default_plan.push_back(entry);  // after the dense MLP's entries
  v.default_ep_plan = {{"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
                       {"layers.*.mlp.experts.down_proj", "grouped_gemm"},
                       {"layers.*.mlp.experts", "ep_dispatch_experts"}};
  v.checkpoint_names.experts = &kNamings[1];  // mlp.experts.E.{gate,up,down}_proj
  return with_sparse_moe(std::move(v), MoeConfig::from(config, MoeKeys{}));
}

}  // namespace tp
