#pragma once
// Data parallelism over ModelParameters' gradient and weight slabs.
//
// The slab is cut into buckets of whole parameters (DDP's bucket_cap_mb; the
// tp-replicated prefix ends a bucket, so its buckets are the same on every tp
// rank). During the step's last backward the autograd engine reports each
// parameter whose gradient is complete; a bucket whose parameters are all
// complete is reduced right there, in the middle of the backward, which then
// goes on with the earlier layers. Buckets are reduced in one fixed order (last
// bucket first, the order the backward completes them) on every rank, as MPI needs.
//   dp_shard = 1: all-reduce each bucket over dp_replicate (DDP).
//   dp_shard > 1: reduce each bucket over dp_shard, rank k keeping the k-th
//     chunk (chunk rule), then all-reduce that chunk over dp_replicate; the rank
//     updates only its chunks (ModelParameters::shard_updates: optimizer state,
//     and under bf16 the f32 masters, for them alone), and after the update the
//     chunks are all-gathered back into every rank's compute weights (Megatron's
//     distributed optimizer; ZeRO stage 2's communication).
// The collectives are blocking, and the dp_shard reduction is an all-reduce of
// which each rank keeps its chunk, because that is what runs fastest on CPU
// ranks (bench/distributed/bench_collectives, 2 ranks, 8-64 MiB): OpenMPI's
// nonblocking all-reduce took 1.8-2.6x the blocking one's time (no progress
// thread, and no idle core to overlap with), and its reduce-scatter, blocking
// or not, 1.5-3.8x an all-reduce of the same buffer; a Qwen3 step's dp_shard
// communication fell from 2.3-2.8 s to 0.6-0.9 s with this choice.
// Losses are normalized by the global target count, so the reduction is a sum.
#include <memory>
#include <unordered_map>
#include <vector>

#include "tp/autograd/tape.h"
#include "tp/training/parameters.h"

namespace tp::training {

class GradientReducer {
 public:
  // `replicate` and `shard`: this rank's dp_replicate and dp_shard groups.
  GradientReducer(ModelParameters& params, dist::ProcessGroup& replicate, dist::ProcessGroup& shard,
                  int64_t bucket_bytes);
  ~GradientReducer() = default;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the reducer for one backward (the step's last micro-batch): while the
  // hook lives, buckets are reduced as their gradients complete.
  std::unique_ptr<autograd::LeafGradReadyHook> watch_backward();
  // After the last backward (or none, on a rank with no data this step):
  // reduces what is left. Then this rank's owned parts of the gradient slab
  // hold the sum over every data-parallel rank.
  void finish();
  // After the optimizer step: the chunks the other dp_shard ranks updated come
  // back into this rank's weights (nothing without sharding).
  void gather_updated_weights();

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  // Buckets of the last backward reduced while it ran (the rest at finish()).
  int64_t launched_during_backward() const { return launched_during_backward_; }
  // Seconds this rank spent in data-parallel communication (reducing,
  // gathering), summed since the last take.
  double take_communication_seconds();

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;    // slab elements
    int pending = 0, params = 0;   // parameters not yet complete in this backward, and in all
    ChunkSpan owned{0, 0};         // within the bucket (the whole bucket without sharding)
    bool ready = false;
  };
  void on_ready(const TensorImpl* leaf);
  void launch_ready();
  void reduce(const Bucket& b);

  ModelParameters& params_;
  dist::ProcessGroup& replicate_;
  dist::ProcessGroup& shard_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const TensorImpl*, size_t> bucket_of_;
  int64_t next_launch_ = -1;  // buckets are reduced from the last to the first
  double comm_clock_ = 0;  // the groups' collective seconds at the last take
  int64_t launched_during_backward_ = 0;
};

}  // namespace tp::training
