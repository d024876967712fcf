// Mistral: the Llama decoder with an optional sliding attention window. Its
// shipped plan is Llama's.
#include "tp/models/variants.h"

namespace tp {

LlamaVariant mistral_variant(const ModelConfig& config) {
  LlamaVariant v{.default_plan = llama_base_tp_plan()};
  auto it = config.raw.find("sliding_window");
  if (it == config.raw.end() || it->is_null()) return v;
  TP_CHECK(it->is_number_integer() && it->get<int64_t>() > 0,
           "{}: 'sliding_window' must be a positive integer or null (no window), got {}", config.source, it->dump());
  v.sliding_window = it->get<int64_t>();
  return v;
}

}  // namespace tp
