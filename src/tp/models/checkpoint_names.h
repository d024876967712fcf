#pragma once
// The small rename table between an architecture's module tree and the Hub's
// checkpoint of it: everything else in the checkpoint (names, shapes, order) is
// read off the tree's parameters (tp/models/layout.h).
#include "tp/models/moe_hub_names.h"

namespace tp {

struct CheckpointNames {
  // Fused expert parameters (mlp.experts.gate_up_proj [E, 2I, H], down_proj
  // [E, H, I]) stored per expert on the Hub under these names, the router
  // under the same block (Mixtral: block_sparse_moe.gate). Null: stored as the
  // tree holds them (GPT-OSS).
  const HubNaming* experts = nullptr;
  // `tp make-model` draws biases like weights instead of zeros (GPT-OSS), so
  // that random test models exercise them.
  bool random_biases = false;
};

}  // namespace tp
