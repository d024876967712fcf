// Qwen3: the Llama decoder plus a per-head RMSNorm on queries and keys (q_norm,
// k_norm over head_dim) before RoPE. Those norms' weights are replicated and see
// only this rank's heads, so the shipped plan all-reduces their gradients.
#include "tp/models/variants.h"

namespace tp {

void qwen_sliding_window(const ModelConfig& config, LlamaVariant& v, bool from_max_window_layers) {
  // Transformers keeps sliding_window only when use_sliding_window (default false); the key's default is 4096.
  if (!config.raw_bool("use_sliding_window", false)) return;
  v.sliding_window = sliding_window_key(config, 4096);
  if (!from_max_window_layers) return;
  auto it = config.raw.find("max_window_layers");
  if (it == config.raw.end() || it->is_null()) {
    v.full_attention_layers = 28;  // Qwen3Config's default
    return;
  }
  TP_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0,
           "{}: 'max_window_layers' must be a non-negative integer (the layers below it keep full attention), got {}",
           config.source, it->dump());
  v.full_attention_layers = it->get<int64_t>();
}

LlamaVariant qwen3_decoder_variant() {
  const parallel::Plan plan =
      parallel::with_entries_after(llama_base_tp_plan(), "layers.*.self_attn.v_proj",
                                   {{"layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                                    {"layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"}});
  return {.qk_norm = true, .default_plan = plan};
}

LlamaVariant qwen3_variant(const ModelConfig& config) {
  LlamaVariant v = qwen3_decoder_variant();
  v.lora_targets = {"q_proj", "v_proj"};
  // Qwen3Config: layers from max_window_layers on are "sliding_attention" (unless layer_types says otherwise).
  qwen_sliding_window(config, v, true);
  return v;
}

}  // namespace tp
