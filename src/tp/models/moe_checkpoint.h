#pragma once
// MoE checkpoints as the Hub stores them, against the module tree's fused 3-D
// expert parameters (Transformers v5's conversion_mapping):
//   model.layers.N.block_sparse_moe.experts.E.{w1,w3,w2}.weight     (Mixtral)
//   model.layers.N.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight (Qwen3-MoE)
//     -> model.layers.N.mlp.experts.gate_up_proj [E, 2I, H] = stack_E(cat(gate, up))
//        model.layers.N.mlp.experts.down_proj    [E, H, I]  = stack_E(down)
//   model.layers.N.block_sparse_moe.gate.weight -> model.layers.N.mlp.gate.weight
// A checkpoint that holds the fused names already is read as it is.
#include <optional>
#include <string>

#include "tp/models/checkpoint.h"
#include "tp/models/moe_hub_names.h"
#include "tp/nn/parallel_layer.h"

namespace tp {

// True when `param` (a fused expert parameter or the router) is not in `ckpt`
// under its own name but under its Hub names.
bool reads_from_hub_names(const Checkpoint& ckpt, const std::string& param);

// This rank's slice (`shard`, of the fused shape `global_shape`) read from the
// Hub tensors: under tensor parallelism the slice of every expert (gate and up
// halves cut separately), under expert parallelism only the owned experts'
// bytes. Errors name the missing tensor or the mismatched shape.
Tensor read_from_hub_names(const Checkpoint& ckpt, const std::string& param, const Shape& global_shape,
                           const nn::ParamShard& shard, DType as);

}  // namespace tp
