// Mixtral: Mistral's decoder with a sparse MoE block in place of every MLP
// (router softmax in f32, top-k, always renormalised; experts w1/w3/w2 fused at
// load into gate_up_proj / down_proj). Plans as Transformers ships them: experts
// cut inside each expert under tensor parallelism (packed gate/up, row-parallel
// down, the partial sums all-reduced once by moe_tp_experts), and masked expert
// parallelism (each rank runs its own experts on every token; ep_size = tp_size).
#include "tp/models/moe.h"
#include "tp/models/variants.h"

namespace tp {

parallel::Plan moe_experts_tp_plan() {
  return {{"layers.*.mlp.experts.gate_up_proj", "packed_colwise"},
          {"layers.*.mlp.experts.down_proj", "rowwise"},
          {"layers.*.mlp.experts", "moe_tp_experts"}};
}

LlamaVariant with_sparse_moe(LlamaVariant v, const MoeConfig& moe) {
  v.make_mlp = [moe](const std::string& name, int64_t layer, const ModelConfig& c) -> std::unique_ptr<nn::Module> {
    if (!moe.is_sparse_layer(layer)) return nullptr;
    return std::make_unique<SparseMoeBlock>(name, c, moe);
  };
  return v;
}

LlamaVariant mixtral_variant(const ModelConfig& config) {
  // Mistral's window on every layer, but MixtralConfig's default is none.
  LlamaVariant v{.sliding_window = sliding_window_key(config, 0), .default_plan = llama_base_tp_plan()};
  // The experts replace the dense MLP's entries.
  v.default_plan = parallel::without_entries(v.default_plan, {"layers.*.mlp.gate_proj", "layers.*.mlp.up_proj", "layers.*.mlp.down_proj"});
  for (auto& entry : moe_experts_tp_plan()) v.default_plan.push_back(entry);
  v.default_ep_plan = {{"layers.*.mlp.gate", "ep_router"},
                       {"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
                       {"layers.*.mlp.experts.down_proj", "grouped_gemm"},
                       {"layers.*.mlp.experts", "moe_tp_experts"}};
  v.checkpoint_names.experts = &kNamings[0];  // block_sparse_moe.experts.E.{w1,w3,w2}, block_sparse_moe.gate
  // num_local_experts experts of intermediate_size each, every layer sparse, the top-k weights renormalised.
  const MoeKeys keys{.num_experts = "num_local_experts",
                     .expert_intermediate = "intermediate_size",
                     .always_renormalize = true,
                     .sparse_layer_keys = false};
  return with_sparse_moe(std::move(v), MoeConfig::from(config, keys));
}

}  // namespace tp
