#pragma once
// The Llama-family architectures tp runs, by model_type.
#include "tp/models/llama.h"

namespace tp {

LlamaVariant llama_variant(const ModelConfig& config);    // llama.cpp
LlamaVariant mistral_variant(const ModelConfig& config);  // mistral.cpp
LlamaVariant qwen3_variant(const ModelConfig& config);    // qwen3.cpp
LlamaVariant mixtral_variant(const ModelConfig& config);    // mixtral.cpp
LlamaVariant qwen3_moe_variant(const ModelConfig& config);  // qwen3_moe.cpp
LlamaVariant gpt_oss_variant(const ModelConfig& config);    // gpt_oss.cpp

// Shared by the MoE variants (mixtral.cpp): `v` with a sparse MoE block on the
// layers the config makes sparse.
LlamaVariant with_sparse_moe(LlamaVariant v, const ModelConfig& config);

}  // namespace tp
