#pragma once
// FSDP (ZeRO-3) over the dp_shard dim: the runtime of ModelParameters' fully
// sharded units (TrainingArguments.fsdp "full_shard" / "shard_grad_op").
//
// The decoder calls it around its units (tp/models/unit_hooks.h):
//   - the root unit (embeddings, final norm, lm_head) is gathered for embed_tokens
//     and, with reshard_after_forward, released after it; gathered again before
//     the final norm, it stays through lm_head, the loss and their backward, after
//     which its gradient is reduce-scattered and it is released; the embedding's
//     backward, the last, takes a fresh gradient buffer, which finish() reduces
//     (a tied lm_head's gradient is reduced in those two parts);
//   - a layer's unit is all-gathered before its forward and, with
//     reshard_after_forward, released after it; an identity recorded on the
//     layer's output gathers it again when the backward reaches the layer (its
//     gradient buffer is taken there), and one recorded on its input, which the
//     backward reaches once the layer is done, reduce-scatters the gradient into
//     this rank's chunks and releases the weights and the whole gradient.
// The root's matrices (the vocabulary-sized embedding and lm_head) are held by
// rows (autograd::LeafByRows): the embedding and the fused loss read their
// weights a block of kRowBlockBytes at a time, all-gathered when read, and make
// their gradient a block at a time, summed over dp_shard (and dp_replicate) into
// this rank's chunks before the next. Neither their whole weights nor their whole
// f32 gradient exist in a step (0.6 GB each for Qwen3-0.6B's tied embedding on a
// CPU without bf16 GEMMs, whose compute weights are f32). The root unit itself is
// then its vectors (the final norm).
// The collectives are blocking (see data_parallel.h: nothing to overlap with on
// CPU ranks), so with reshard_after_forward at most one unit is gathered at a
// time; without it (shard_grad_op) every unit stays gathered from its forward to
// its backward. A checkpointed
// layer's recompute runs between those two identities, on the weights the
// backward gathered: no layer is gathered twice. Every rank runs the same units
// in the same order; a dp rank with no data in a micro-batch must still run
// one (the Trainer gives it a batch whose targets are all ignored).
//
// With units that are not sharded (FullyShardOptions::compute_by_unit_only: bf16
// compute without FSDP, d = 1) the same calls hold only the bf16 compute copies
// by unit: a gather rounds the unit's masters into its buffer, nothing is
// reduced (the gradients accumulate in the whole slab as without units), and at
// most one layer's copy, or the root's, exists at a time.
#include <cstdint>
#include <memory>
#include <vector>

#include "tp/autograd/tape.h"
#include "tp/models/unit_hooks.h"
#include "tp/training/parameters.h"

namespace tp::training {

// The bytes of one block of a root matrix's gradient (a whole number of rows, at least one).
inline constexpr int64_t kRowBlockBytes = int64_t{16} << 20;

// Where the blocks of the root's matrices are made (allocated once, reused by every block).
struct RowBuffers {
  Tensor scratch;  // f32: a block of weights being all-gathered
  Tensor weights;  // the block in the compute dtype, when that is bf16
  Tensor grad;     // f32: a block of gradient
};

class FullyShardedDataParallel : public UnitHooks {
 public:
  // `params` fully sharded over `shard`; `replicate`: this rank's dp_replicate group (HSDP).
  FullyShardedDataParallel(ModelParameters& params, dist::ProcessGroup& replicate, bool reshard_after_forward);
  // `params` held by unit without sharding (compute copies only; resharded after forward).
  explicit FullyShardedDataParallel(ModelParameters& params);
  ~FullyShardedDataParallel() override;  // takes its row sinks off the model's weights
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  void begin_forward() override;
  Tensor leave_embedding(const Tensor& h) override;
  Tensor enter_head(const Tensor& h) override;
  Tensor enter_layer(int64_t layer, const Tensor& h) override;
  Tensor leave_layer(int64_t layer, const Tensor& h) override;

  // Arms every backward of a step: the engine then adds each parameter's
  // gradient into its unit's buffer at the parameter's last use, inside the
  // unit's window (not at the end of the backward, when the buffer is gone).
  std::unique_ptr<autograd::LeafGradReadyHook> watch_backward() const;
  // After the step's last backward: reduces what the backward did not (the
  // root, and a layer whose input needed no gradient), and releases every unit.
  void finish();
  // Releases every unit's weights (after an evaluation: the root would stay gathered).
  void release();
  // After the optimizer step: the units gather the new weights when they run next.
  void gather_updated_weights() { params_.gather_updated_weights(); }

  // All-gathers of units since the last take (per micro-batch: each layer once in
  // the forward and, resharded after it, once more in the backward; the root
  // once, or twice when resharded).
  int64_t take_gathers();
  // The most decoder layers gathered at once so far (the root not counted).
  int64_t max_gathered_layers() const { return max_gathered_layers_; }
  // The most bytes of whole units held at once so far: gathered weights, whole
  // gradients, and the buffer of the root's gradient blocks (all besides the
  // chunks every rank keeps).
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  // Seconds spent in its collectives since the last take.
  double take_communication_seconds();
  // Blocks of the root's gradients of about `bytes` (kRowBlockBytes by default;
  // tests take a few rows at a time).
  void set_row_block_bytes(int64_t bytes);
  // Bytes of the buffers the root's blocks of rows are made in (weights, gradient; 0 before the first step).
  int64_t row_buffer_bytes() const;

 private:
  FullyShardedDataParallel(ModelParameters& params, dist::ProcessGroup* replicate, bool reshard_after_forward);
  int64_t unit_of_layer(int64_t layer) const;
  double collective_seconds() const;  // so far, over dp_replicate and dp_shard
  void gather(size_t u);
  void begin_grads(size_t u);
  void reduce(size_t u);
  void note_gathered_bytes();

  ModelParameters& params_;
  dist::ProcessGroup* replicate_;  // null for units without sharding
  bool reshard_after_forward_;
  std::vector<int64_t> layer_unit_;  // layer index -> unit, -1 where a layer has nothing trained
  int64_t root_ = -1;                // the root's unit, -1 if it has nothing trained
  int64_t gathers_ = 0, max_gathered_layers_ = 0, peak_gathered_bytes_ = 0;
  int64_t row_block_bytes_ = kRowBlockBytes;
  RowBuffers rows_;  // shared by the root's matrices held by rows
  std::vector<Tensor> sunk_;  // the weights whose gradients come by rows
  double comm_clock_ = 0;
};

}  // namespace tp::training
