#pragma once
// The Hub's names of MoE tensors (per expert, renamed routers) against the
// module tree's fused parameters: pure string work, apart from reading
// (moe_checkpoint.h), so config checks can place a name without the loader.
#include <cstdint>
#include <optional>
#include <string>

namespace tp {

// Where one Hub tensor lives in the module tree: `param`, expert `expert` (-1:
// the whole parameter, a renamed tensor), rows [row_offset, + rows) of its dim 1
// (rows == 0: all of them).
struct FusedLocation {
  std::string param;
  int64_t expert = -1;
  int64_t row_offset = 0;
  int64_t rows = 0;
};
// For a Hub name of a per-expert or renamed MoE tensor; nothing for other names.
// `param_rows`: the parameter's size in dim 1 (2I for gate_up_proj), to place the halves.
std::optional<FusedLocation> fused_location(const std::string& hub_name, int64_t param_rows);

// The Hub's per-expert names: the block's name and the three projections'
// (Mixtral's block_sparse_moe w1/w3/w2, then Qwen3-MoE's / DeepSeek's mlp *_proj).
struct HubNaming {
  const char* block;
  const char* gate;
  const char* up;
  const char* down;
};
extern const HubNaming kNamings[2];

// "model.layers.N." of a name, or empty.
std::string layer_prefix(const std::string& name);
// model.layers.N.<block>.experts.<e>.<proj>.weight
std::string expert_key(const std::string& layer, const HubNaming& n, int64_t e, const char* proj);

}  // namespace tp
