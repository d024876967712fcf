#pragma once
// What every rank of a tensor-parallel group holds of one parameter, and the
// full tensor put back together from those pieces: for checkpoints written by
// one rank, for gradient norms that count each slice once, and for tests.
// Collective over the group: every rank calls these for the same parameters
// in the same order.
#include <vector>

#include "tp/distributed/process_group.h"
#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// Every rank's shard of the parameter whose shard on this rank is `mine`.
std::vector<nn::ParamShard> all_shards(const nn::ParamShard& mine, dist::ProcessGroup& group);

// The lowest rank that holds the same slice as `rank` (0 for a replicated
// parameter; the first of its replicas for a KV head held by several ranks).
int first_holder(const std::vector<nn::ParamShard>& shards, int rank);

// The tensor of `global_shape` from every rank's `local` piece (dtype kept).
// Replicated parameters return rank 0's copy on every rank.
Tensor gather_full(const Tensor& local, const Shape& global_shape, const std::vector<nn::ParamShard>& shards,
                   dist::ProcessGroup& group);

}  // namespace tp::parallel
