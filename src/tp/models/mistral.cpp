// Mistral: the Llama decoder with a sliding attention window on every layer.
// Its shipped plan is Llama's.
#include "tp/models/variants.h"

namespace tp {

int64_t sliding_window_key(const ModelConfig& config, int64_t absent) {
  auto it = config.raw.find("sliding_window");
  if (it == config.raw.end()) return absent;
  if (it->is_null()) return 0;
  TP_CHECK(it->is_number_integer() && it->get<int64_t>() > 0,
           "{}: 'sliding_window' must be a positive integer or null (no window), got {}", config.source, it->dump());
  return it->get<int64_t>();
}

LlamaVariant mistral_variant(const ModelConfig& config) {
  // MistralConfig's default: a file without the key has a window of 4096 in Transformers.
  // Its attention has no biases, whatever config.json says (MistralConfig has no attention_bias).
  return {.sliding_window = sliding_window_key(config, 4096),
          .qkv_bias = false,
          .o_bias = false,
          .default_plan = llama_base_tp_plan(),
          .lora_targets = {"q_proj", "v_proj"}};
}

}  // namespace tp
