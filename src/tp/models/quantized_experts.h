#pragma once
// MoE experts whose Hub per-expert Linears are stored quantized (GPTQ, AWQ, compressed-tensors: a GPTQ Qwen3-MoE
// holds model.layers.N.mlp.experts.E.gate_proj.qweight, ...), kept packed at inference: this rank's experts, each
// projection its slice as the fused parameters' shards say (gate_up_proj's rows cut in its gate and up halves,
// down_proj's inputs), read with read_quantized's vLLM rules, one ops::QuantizedLinear a projection and expert.
#include <string>
#include <vector>

#include "tp/models/checkpoint.h"
#include "tp/models/moe_hub_names.h"
#include "tp/nn/moe.h"

namespace tp {

// Whether `experts` (a Mixtral / Qwen3-MoE / DeepSeek layout) has its per-expert Linears quantized in `ckpt`.
bool reads_quantized_experts(const Checkpoint& ckpt, const nn::MoeExperts& experts);

// Every local expert's shard against the quantization's rules (check_quantized_shard), before anything is read.
void check_quantized_expert_shards(const Checkpoint& ckpt, const nn::MoeExperts& experts);

struct QuantizedExperts {
  std::vector<ops::QuantizedLinear> gate, up, down;  // a local expert each: [I slice, H], [I slice, H], [H, I slice]
};
QuantizedExperts read_quantized_experts(const Checkpoint& ckpt, const nn::MoeExperts& experts);

// Whether `q` quantizes these experts' per-expert Linears, stored under `naming`
// (the architecture's CheckpointNames::experts; null: fused, never quantized), from the config alone.
bool quantizes_experts(const QuantizationConfig& q, const HubNaming* naming, const nn::MoeExperts& experts);

// The bytes read_quantized_experts will hold on this rank (the shards applied) for gate_up_proj (gate and up) and
// for down_proj, from the config alone.
struct QuantizedExpertBytes {
  int64_t gate_up = 0, down = 0;
};
QuantizedExpertBytes quantized_experts_bytes(const QuantizationConfig& q, const nn::MoeExperts& experts);

}  // namespace tp
