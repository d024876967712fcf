// GPT-OSS: the Llama decoder with biases on q/k/v/o, a learned sink logit per
// query head (self_attn.sinks), layers alternating sliding-window and full
// attention (layer_types), yarn RoPE, and a sparse MoE block on every layer:
// router mlp.router with a bias (top-k of the raw logits, softmax over the k),
// experts stored in x out with interleaved gate/up columns and biases, and the
// clamped SwiGLU (see tp/ops/moe_experts.h).
//
// Plans. Transformers ships no base_model_tp_plan for gpt_oss today (early v5:
// only moe_tp_experts on the experts, which leaves every expert whole on every
// rank), so this one is ours, with the styles' usual meaning of the cut:
//   attention colwise / rowwise as Llama's; sinks colwise (Shard(0): the sinks
//   of this rank's query heads, matching q_proj's rows), self_attn local_params.
//   experts.gate_up_proj [E, H, 2I] rowwise = Shard(-1), and its bias [E, 2I]
//   likewise: contiguous columns, so whole (gate, up) pairs when I % tp == 0;
//   experts.down_proj [E, I, H] colwise = Shard(1), the same I slice. In this
//   x-by-W layout Linear's two styles cut the opposite dims, which is what the
//   intermediate dim needs (packed_colwise would cut H).
//   moe_tp_experts sums the partial outputs once, then adds the routed down bias.
// The ep plan is Transformers': masked EP (ep_router, grouped_gemm on the four
// expert tensors, moe_tp_experts).
#include "tp/models/moe.h"
#include "tp/models/variants.h"

namespace tp {

LlamaVariant gpt_oss_variant(const ModelConfig& config) {
  // GptOssConfig's default window is 128; the "sliding_attention" layers use it.
  LlamaVariant v{.sliding_window = sliding_window_key(config, 128), .attention_sinks = true,
                 .default_plan = llama_base_tp_plan()};
  // The experts replace the dense MLP's entries.
  v.default_plan = parallel::without_entries(v.default_plan, {"layers.*.mlp.gate_proj", "layers.*.mlp.up_proj", "layers.*.mlp.down_proj"});
  // The attention runs on local tensors (its sinks are this rank's heads' own, not a gathered whole).
  v.default_plan.push_back({"layers.*.self_attn", "local_params"});
  v.default_plan.push_back({"layers.*.self_attn.sinks", "colwise"});
  v.default_plan.push_back({"layers.*.mlp.experts.gate_up_proj", "rowwise"});
  v.default_plan.push_back({"layers.*.mlp.experts.gate_up_proj_bias", "rowwise"});
  v.default_plan.push_back({"layers.*.mlp.experts.down_proj", "colwise"});
  v.default_plan.push_back({"layers.*.mlp.experts", "moe_tp_experts"});
  v.default_ep_plan = {{"layers.*.mlp.router", "ep_router"},
                       {"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
                       {"layers.*.mlp.experts.gate_up_proj_bias", "grouped_gemm"},
                       {"layers.*.mlp.experts.down_proj", "grouped_gemm"},
                       {"layers.*.mlp.experts.down_proj_bias", "grouped_gemm"},
                       {"layers.*.mlp.experts", "moe_tp_experts"}};
  // Its experts are stored fused, as the tree holds them; biases and sinks drawn like weights.
  v.checkpoint_names.random_biases = true;
  // Sized as Mixtral's (num_local_experts, intermediate_size), every layer sparse.
  const MoeKeys keys{.num_experts = "num_local_experts",
                     .expert_intermediate = "intermediate_size",
                     .always_renormalize = true,
                     .sparse_layer_keys = false,
                     .gpt_oss = true};
  return with_sparse_moe(std::move(v), MoeConfig::from(config, keys));
}

}  // namespace tp
