// Qwen2 / Qwen2.5: the Llama decoder with biases on the query, key and value
// projections (none on o_proj), and Qwen's sliding window (under
// use_sliding_window, on the layers from max_window_layers on). Its shipped
// plan is Llama's: a bias is cut with its projection's rows.
#include "tp/models/variants.h"

namespace tp {

LlamaVariant qwen2_variant(const ModelConfig& config) {
  LlamaVariant v{.qkv_bias = true, .o_bias = false, .default_plan = llama_base_tp_plan(), .lora_targets = {"q_proj", "v_proj"}};
  qwen_sliding_window(config, v, true);  // Qwen2Config's rule and defaults are Qwen3Config's
  return v;
}

}  // namespace tp
