#pragma once
// The Llama-family architectures tp runs, by model_type.
#include "tp/models/llama.h"
#include "tp/models/moe.h"

namespace tp {

LlamaVariant llama_variant(const ModelConfig& config);    // llama.cpp
LlamaVariant mistral_variant(const ModelConfig& config);  // mistral.cpp
LlamaVariant qwen3_variant(const ModelConfig& config);    // qwen3.cpp
LlamaVariant qwen2_variant(const ModelConfig& config);    // qwen2.cpp
LlamaVariant mixtral_variant(const ModelConfig& config);    // mixtral.cpp
LlamaVariant qwen3_moe_variant(const ModelConfig& config);  // qwen3_moe.cpp
LlamaVariant gpt_oss_variant(const ModelConfig& config);    // gpt_oss.cpp

// config.json's sliding_window: `absent` when the key is missing (the
// architecture's Transformers default), 0 when null.
int64_t sliding_window_key(const ModelConfig& config, int64_t absent);  // mistral.cpp
// Qwen3's decoder (q_norm / k_norm and their plan entries), without a window.
LlamaVariant qwen3_decoder_variant();  // qwen3.cpp
// Qwen3 and Qwen3-MoE: the window only under use_sliding_window; with
// `from_max_window_layers`, the layers below max_window_layers keep full attention.
void qwen_sliding_window(const ModelConfig& config, LlamaVariant& v, bool from_max_window_layers);  // qwen3.cpp

// Shared by the MoE variants (mixtral.cpp): `v` with a sparse MoE block on the
// layers `moe` makes sparse.
LlamaVariant with_sparse_moe(LlamaVariant v, const MoeConfig& moe);

}  // namespace tp
