#pragma once
// The Llama-family architectures tp runs, by model_type.
#include "tp/models/llama.h"

namespace tp {

LlamaVariant llama_variant(const ModelConfig& config);    // llama.cpp
LlamaVariant mistral_variant(const ModelConfig& config);  // mistral.cpp
LlamaVariant qwen3_variant(const ModelConfig& config);    // qwen3.cpp

}  // namespace tp
