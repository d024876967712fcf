#pragma once
// The trainable state of a tensor-parallel model on one rank. Every parameter's
// local piece appears once (tied names share it) in flat f32 slabs that live for
// the whole run: master weights and gradients. The model computes with the
// masters themselves in f32 training, or, under mixed precision (Transformers'
// bf16=True), with a bf16 copy of each matrix refreshed after every update;
// vectors (norms, biases) compute in f32 either way. Gradients accumulate
// straight into their slab (Tensor::set_grad), so a step allocates nothing for them.
// Where bf16 GEMMs are slower than f32 ones (ops::detail::bf16_gemm_native), the
// compute copy holds the bf16 values in f32 and the Linear modules round their
// inputs: the same arithmetic, run as f32 GEMMs.
//
// Under bf16 without FSDP the Trainer has the compute copies held by unit all
// the same (FullyShardOptions::compute_by_unit_only: a decoder layer each, and
// the root), rounded from the masters where the unit runs, so that no whole bf16
// copy of the model sits beside the masters in a step.
//
// Replicated parameters sit first in the slabs, so one broadcast covers them all.
//
// Expert parallelism (the model's mesh has "ep"): the experts' parameters are
// sharded over the ep group (every rank) by their expert dim; everything else is
// held by each tp group whole (its ep replica), and the replicas run the same
// tokens. The slabs hold [tp-replicated][tp-sharded][expert-sharded], so one
// broadcast over the replicas covers everything but the experts.
//
// Sharded over dp_shard (shard_updates, Megatron's distributed optimizer): each
// rank updates only its chunk of every gradient bucket, keeps optimizer state
// for it alone and, under mixed precision, the f32 master weights of its chunks
// alone (in f32 training the masters are the weights the model computes with,
// so they stay whole); after an update the chunks are all-gathered back into
// every rank's compute weights. The gradient slab stays whole: the backward
// accumulates into it, and the reduce-scatter leaves each rank its chunk.
//
// Fully sharded over dp_shard (FullyShardOptions, FSDP / ZeRO-3): the parameters
// are grouped into units (a decoder layer each, and the root: embeddings, final
// norm, lm_head) and the slabs ordered by unit. Each rank keeps only its chunks'
// f32 masters, gradients and optimizer state; a unit's compute weights and its
// whole gradient are buffers that exist only while training/fsdp.h has the unit
// gathered (Storage::release), so every rank holds about 16 bytes per parameter
// / (tp x dp_shard) plus the units gathered at the time.
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "tp/distributed/process_group.h"
#include "tp/nn/module.h"

namespace tp::training {

// Transformers' no-decay rule: lowercased names matching bias, layernorm,
// rmsnorm, ".norm" or "_norm" get no weight decay (embeddings do).
bool decays(const std::string& name);

// Part of a parameter whose update this rank owns: local elements [begin, end),
// their optimizer state at [state, state + end - begin) of the state slabs.
struct OwnedSegment {
  int64_t begin = 0, end = 0, state = 0;
};

struct TrainableParam {
  std::string name;                  // the checkpoint name (the first of tied names)
  int64_t index = 0;                 // its place among the trained parameters, in the model's order
  int64_t unit = -1;                 // FSDP or compute by unit: its unit (decoder layer index, -1 for the root)
  // FSDP: a root matrix (the vocabulary-sized embedding, lm_head) whose gradient
  // arrives a block of rows at a time (add_grad_rows), never whole; `grad` is
  // then a view of memory that is never taken.
  bool grad_by_rows = false;
  std::vector<nn::Parameter*> refs;  // every module parameter that shares it
  Shape global_shape;
  std::vector<nn::ParamShard> shards;  // every tp rank's slice
  Tensor master;                     // f32 view into the master slab (undefined for a matrix whose masters are sharded)
  Tensor compute;                    // what the model runs with (master, or its bf16 copy)
  Tensor grad;                       // f32 view into the gradient slab
  int64_t offset = 0;                // into the slabs, in elements
  bool decay = true;
  bool replicated = false;           // every tp rank holds all of it
  bool counted = true;               // this rank's slice counts toward the global norm
  bool expert_sharded = false;       // sharded over the ep group by its expert dim (shards are the ep ranks')
  // What this rank updates: all of it, state laid out like the slabs, unless the
  // optimizer is sharded over data-parallel ranks (ModelParameters::shard_updates).
  std::vector<OwnedSegment> owned;
};

// [begin, end) elements of the slabs.
struct SlabRange {
  int64_t begin = 0, end = 0;
};

// The sum of every rank's value, added in rank order: the same bits on every rank. Collective.
double sum_over_ranks(double value, dist::ProcessGroup& group);

// p's compute copy (bf16, or bf16 values in f32) of the segment's elements (a
// view); undefined where p computes on its masters.
Tensor compute_copy_of(const TrainableParam& p, const OwnedSegment& seg);

// The groups of an expert-parallel mesh: "ep" (every rank; the experts are cut
// over it) and "ep_replicas" (the ranks with the same tp coordinate).
struct ExpertParallelGroups {
  dist::ProcessGroup* ep = nullptr;
  dist::ProcessGroup* replicas = nullptr;
  bool enabled() const { return ep != nullptr; }
};

// FSDP over `group` (the dp_shard group): unit_of gives a parameter's unit, the
// index of its decoder layer or -1 for the root (everything outside the layers).
// unit_of without a group: the units without sharding (FSDP with d = 1, under
// bf16 compute only): the masters and gradients stay whole slabs, and only the
// bf16 compute copies are held by unit, rounded from the masters when a unit
// is gathered (ModelParameters::gather_unit) and released after it, so no whole
// copy of the model in bf16 exists in a step.
struct FullyShardOptions {
  dist::ProcessGroup* group = nullptr;
  std::function<int64_t(const std::string&)> unit_of;
  bool enabled() const { return group != nullptr; }
  bool compute_by_unit_only() const { return group == nullptr && static_cast<bool>(unit_of); }
};

// One fully sharded unit: its parameters' slab range, and the buffers of its
// gathered compute weights and of its whole gradient (released when not in use).
// A unit without sharding (FullyShardOptions::compute_by_unit_only) has only
// `id` and `compute`: its gradients are in the slab, and its slab range, buckets
// and parameter range are unused (its parameters are those with p.unit == id).
struct ParamUnit {
  int64_t id = -1;                 // decoder layer index, -1 for the root
  int64_t begin = 0, end = 0;      // slab elements
  std::vector<size_t> buckets;     // its buckets (ModelParameters::buckets()), in order
  size_t first = 0, last = 0;      // its parameters: params()[first, last)
  std::shared_ptr<Storage> compute, grad;
  std::shared_ptr<Storage> rows_compute;  // its grad_by_rows matrices' weights (null if none), whole outside the steps
};

class ModelParameters {
 public:
  // Takes over `model`'s parameters: their values move into the slabs and the
  // model's tensors become the compute weights. `trainable` picks the parameters
  // that get gradients (all by default); the others are frozen: no slab, no
  // gradient, no optimizer state (under bf16 their matrices are rounded to bf16 once).
  // Collective over `tp_group` (each rank learns every rank's slices), and over
  // the ep group when `ep` is enabled.
  // Under bf16, `bf16_native_gemm` says how the matrices compute (TrainerOptions::bf16_native_gemm);
  // unset: rank 0's measurement, broadcast so that ranks agree.
  ModelParameters(nn::Module& model, dist::ProcessGroup& tp_group, bool bf16_compute,
                  const std::function<bool(const std::string&)>& trainable = {},
                  const ExpertParallelGroups& ep = {}, const FullyShardOptions& fsdp = {},
                  std::optional<bool> bf16_native_gemm = std::nullopt);
  ModelParameters(const ModelParameters&) = delete;
  ModelParameters& operator=(const ModelParameters&) = delete;

  std::vector<TrainableParam>& params() { return params_; }
  const std::vector<TrainableParam>& params() const { return params_; }
  const TrainableParam& find(const std::string& name) const;  // error lists nothing, names the parameter
  Tensor& master_slab() { return master_; }
  Tensor& grad_slab() { return grad_; }
  int64_t numel() const { return numel_; }              // local elements, padding included
  int64_t replicated_numel() const { return replicated_end_; }
  // Elements of the optimizer state this rank keeps (numel() unless sharded).
  int64_t state_numel() const { return state_numel_; }

  // Sharding over the data-parallel shard group: `buckets` cut the slabs into
  // consecutive ranges (the gradient buckets), and rank k of `shard_group` owns
  // chunk k of each (the chunk rule): it updates, and keeps optimizer state and
  // (under bf16 compute) f32 masters for, only those. Gradient norms then sum
  // each rank's owned part over `shard_group` too.
  void shard_updates(dist::ProcessGroup& shard_group, const std::vector<SlabRange>& buckets);
  bool updates_sharded() const { return shard_group_ != nullptr; }
  bool masters_sharded() const { return masters_sharded_; }
  // Bytes of f32 master weights this rank holds.
  int64_t master_bytes() const {
    if (fsdp_) return static_cast<int64_t>(master_shard_.nbytes());
    return static_cast<int64_t>(masters_sharded_ ? master_shard_.nbytes() + vector_slab_.nbytes() : master_.nbytes());
  }
  const std::vector<SlabRange>& buckets() const { return buckets_; }
  // This rank's chunk of bucket b, relative to the bucket's start.
  ChunkSpan owned_chunk(size_t b) const;
  // p's masters of the segment's elements (a view of the slab or the shard).
  Tensor owned_master(const TrainableParam& p, const OwnedSegment& seg) const;
  // After an update of the owned parts: every rank gets the others' updated
  // chunks (masters or compute copies), and the compute copies are current. Collective.
  void gather_updated_weights();
  // Every parameter's local f32 masters in slab layout (gathered over the shard
  // group when sharded; collective then), and p's view of such a slab.
  Tensor full_masters() const;
  static Tensor local_view(const Tensor& slab, const TrainableParam& p);
  // Sets the masters (this rank's owned parts) and compute copies from a slab in slab layout.
  void load_masters(const Tensor& full);
  // Optimizer state between this rank's owned layout and the slab layout (the
  // layout of checkpoints, whatever the sharding): to_full gathers the owned
  // parts of every rank of the shard group (collective), from_full keeps this
  // rank's. Without sharding both are the identity.
  Tensor state_to_full(const Tensor& state) const;
  void state_from_full(const Tensor& full, Tensor& state) const;
  bool bf16_compute() const { return bf16_; }
  // Under bf16 compute: native bf16 GEMMs (else bf16 values in f32); every rank agrees.
  bool bf16_native() const { return bf16_native_; }
  dist::ProcessGroup& group() const { return group_; }
  // The group p's shards are over: the ep group for expert-sharded parameters, else the tp group.
  dist::ProcessGroup& group_of(const TrainableParam& p) const { return p.expert_sharded ? *ep_.ep : group_; }
  const ExpertParallelGroups& expert_parallel() const { return ep_; }

  // ---- fully sharded (FSDP), or compute copies by unit
  bool fully_sharded() const { return fsdp_; }
  // The compute weights live in unit buffers, gathered around their unit's use
  // (FSDP, or FullyShardOptions::compute_by_unit_only): outside that they are released.
  bool computes_by_unit() const { return !units_.empty(); }
  dist::ProcessGroup* shard_group() const { return shard_group_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  // Takes memory for unit u's compute weights and all-gathers them from every
  // rank's masters (rounded to the compute precision). Collective over dp_shard.
  // Without sharding: rounds this rank's masters of the unit into them.
  // `rows`: its grad_by_rows matrices too (the steps read those a block at a time, weight_rows).
  void gather_unit(size_t u, bool rows = true);
  void release_unit(size_t u);
  bool unit_gathered(size_t u, bool rows = false) const {
    const ParamUnit& unit = units_[u];
    return !unit.compute->released() && (!rows || unit.rows_compute == nullptr || !unit.rows_compute->released());
  }
  // Rows [row0, row0 + rows) of p's weights (p.grad_by_rows) in its compute dtype,
  // all-gathered from every rank's masters into `out` (f32 `scratch` on the way),
  // as gather_unit rounds them. Collective over dp_shard: every rank, the same rows.
  Tensor weight_rows(const TrainableParam& p, int64_t row0, int64_t rows, Tensor& scratch, Tensor& out) const;
  // Takes memory for unit u's whole gradient (but its grad_by_rows parameters'),
  // zeroed, for a backward to accumulate into.
  void begin_unit_grads(size_t u);
  bool unit_grads_live(size_t u) const { return units_[u].grad != nullptr && !units_[u].grad->released(); }
  // Sums unit u's gradient over dp_shard and then dp_replicate, adds this rank's
  // chunks into its gradient shard and releases the whole gradient. Collective.
  // Nothing for a unit without sharding (its gradients are in the slab).
  void reduce_unit_grads(size_t u, dist::ProcessGroup& replicate);
  // Sums rows [row0, row0 + rows.size(0)) of p's gradient (p.grad_by_rows) over
  // dp_shard and then dp_replicate, and adds this rank's part of them into its
  // gradient shard. Collective: every rank, the same rows in the same order.
  void add_grad_rows(const TrainableParam& p, int64_t row0, const Tensor& rows, dist::ProcessGroup& replicate);
  // This rank's gradient of the segment's elements of p (a view): in the
  // gradient shard when fully sharded, else in the slab.
  Tensor owned_grad(const TrainableParam& p, const OwnedSegment& seg) const;

  void zero_grad();
  // After the masters changed (an optimizer step, a resume): rounds them into
  // the bf16 compute copies. Not with sharded masters (gather_updated_weights is the way there).
  void refresh_compute_weights();
  // Makes every rank's gradients of replicated parameters bitwise those of tp
  // rank 0: MPI does not promise that a reduction gives every rank the same bits,
  // and replicas must not drift apart over a run. Collective.
  void sync_replicated_grads();
  // Under expert parallelism with several ep replicas (tp groups that ran the
  // same tokens): each replica holds the whole gradient of every parameter but
  // the experts (whose pairs token dispatch computed once, over the ep group);
  // replica 0's is broadcast, so replicas hold the same bits and cannot drift
  // (a reduction need not give every rank the same bits). Nothing otherwise. Collective.
  void sync_ep_replicas();
  // The L2 norm of the whole model's gradient: each slice counted once (sharded
  // squares summed over ranks, replicated and tied parameters once; under expert
  // parallelism each expert once over the ep group, the rest once per replica),
  // the same value on every rank. Reads only the owned parts. Collective.
  double global_grad_norm() const;

  // The full tensor of a parameter's master weights (collective).
  Tensor gather_master(const TrainableParam& p) const;

 private:
  dist::ProcessGroup& group_;
  ExpertParallelGroups ep_;
  bool bf16_, bf16_native_ = false;
  std::vector<TrainableParam> params_;
  Tensor master_, grad_, compute_copy_;
  int64_t numel_ = 0, replicated_end_ = 0, state_numel_ = 0;
  int64_t ep_replicated_end_ = 0;  // the slabs' elements before the expert-sharded parameters
  dist::ProcessGroup* shard_group_ = nullptr;
  std::vector<SlabRange> buckets_;
  bool masters_sharded_ = false;
  Tensor master_shard_;  // sharded masters: the owned elements', laid out like the optimizer state
  Tensor vector_slab_;   // sharded masters: vectors (which compute in f32 on their masters), whole
  void shard_masters();
  // The owned segments and the optimizer state's layout for buckets_ (the chunk rule).
  void assign_owned();
  // FSDP: the slabs as units and buckets, their buffers, and the masters cut to this rank's chunks.
  void fully_shard(const FullyShardOptions& fsdp);
  // Without sharding: the units' compute buffers, and the bf16 matrices' compute tensors as views of them.
  void compute_by_unit(const std::function<int64_t(const std::string&)>& unit_of);
  bool fsdp_ = false;
  std::vector<ParamUnit> units_;
  struct BucketLayout {
    DType compute = DType::F32;  // the compute weights' dtype (one per bucket)
    size_t compute_byte = 0;     // where they start in the unit's compute buffer
    int64_t state = 0;           // where this rank's chunk starts in the state layout
    bool replicated = false;     // over tp: synced from tp rank 0
    size_t unit = 0;
    bool by_rows = false;        // its parameters' gradients come by rows (not in the unit's buffer)
  };
  std::vector<BucketLayout> layout_;
  Tensor grad_shard_;  // FSDP: this rank's chunks of the gradient, laid out like the optimizer state
  // Every rank's owned parts in slab layout, `source` giving a segment's values. Collective.
  Tensor gather_owned(const std::function<Tensor(const TrainableParam&, const OwnedSegment&)>& source) const;
};

}  // namespace tp::training
