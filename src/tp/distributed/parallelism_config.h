#pragma once
// ParallelismConfig (accelerate's names): how the ranks split into data-parallel
// replicas, data-parallel shards and tensor-parallel groups. The mesh is
//   dp_replicate × dp_shard × tp, row-major, tp innermost
// so a tp group is consecutive ranks (one node's cores before another's). For
// 8 ranks with dp_replicate 2, dp_shard 2, tp 2:
//   rank:          0 1 | 2 3 | 4 5 | 6 7
//   dp_replicate:  0 0   0 0   1 1   1 1
//   dp_shard:      0 0   1 1   0 0   1 1
//   tp:            0 1   0 1   0 1   0 1
//   "dp" (flattened dp_replicate × dp_shard): {0,2,4,6} {1,3,5,7}
// Every style and the loader use the mesh's "tp" dim only; the Trainer splits
// the data over "dp", shards the optimizer over "dp_shard" and averages the
// gradients of replicas over "dp_replicate".
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tp/distributed/device_mesh.h"

namespace tp::dist {

struct ParallelismConfig {
  std::optional<int64_t> dp_replicate_size, dp_shard_size, tp_size;

  // Every size set for `world_size` ranks: dp_shard defaults to 1; with neither
  // tp nor dp_replicate given, tp takes the rest (all ranks tensor-parallel);
  // otherwise the unset one of them is world / (the others). Errors name every
  // size and the number of ranks.
  ParallelismConfig resolved(int64_t world_size) const;
  int64_t dp_size() const { return dp_replicate_size.value_or(1) * dp_shard_size.value_or(1); }
  // "dp_replicate_size=2, dp_shard_size=1, tp_size=2" (unset sizes as "auto").
  std::string to_string() const;
  // The mesh {"dp_replicate", "dp_shard", "tp"} over the world, resolved for its
  // size, with "dp" flattened from the first two. Collective.
  std::shared_ptr<const DeviceMesh> build_device_mesh() const;
};

}  // namespace tp::dist
