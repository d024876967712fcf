// Qwen3: the Llama decoder plus a per-head RMSNorm on queries and keys (q_norm,
// k_norm over head_dim) before RoPE. Those norms' weights are replicated and see
// only this rank's heads, so the shipped plan all-reduces their gradients.
#include "tp/models/variants.h"

namespace tp {

LlamaVariant qwen3_variant(const ModelConfig& config) {
  parallel::Plan plan = llama_base_tp_plan();
  plan.insert(plan.begin() + 3, {"layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"});
  plan.insert(plan.begin() + 4, {"layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"});
  return {.qk_norm = true, .default_plan = plan};
}

}  // namespace tp
