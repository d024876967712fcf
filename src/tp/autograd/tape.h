#pragma once
// Tape-based reverse-mode autograd.
//
// A differentiable op computes its forward, then, when needs_grad(inputs),
// records {inputs, outputs, backward closure} on the thread's tape. backward()
// walks the tape from the newest entry to the oldest, calling each closure whose
// outputs received a gradient, and accumulates the results into the inputs'
// gradients; leaves keep theirs in tensor.grad() (summed across backward calls
// until zero_grad). Under NoGradGuard nothing is recorded: inference pays one
// flag test per op.
//
// Collectives are ops too (tp/dist): every rank records the same entries in the
// same order, so the backward collectives match up across ranks.
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::autograd {

bool is_grad_enabled();

// Disables recording in its scope (inference).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Sets grad mode in its scope; GradModeGuard(true) lets a checkpointed block's
// recompute record inside a backward.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and any defined input requires a gradient.
bool needs_grad(const std::vector<Tensor>& inputs);
// The same for a braced list, needs_grad({x, w, b}): every op asks on every forward,
// so this form builds no vector.
bool needs_grad(std::initializer_list<Tensor> inputs);

// Given the gradients of the outputs (always defined: zeros for an output that
// received none), returns one gradient per input, in input order; an undefined
// Tensor means "no gradient for this input".
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// Records an op. Marks every output as requiring grad. Call only when
// needs_grad(inputs) is true.
void record(const char* name, std::vector<Tensor> inputs, std::vector<Tensor> outputs, BackwardFn backward_fn);

// Runs backward from `root`. `grad_root` defaults to 1 (root must then have one element).
// Removes the entries it ran (entries of graphs it does not reach stay). The tape
// keeps no input's data: each entry's closure, and what it saved, is released as
// soon as it has run, so activations are freed as the backward walks past them.
void backward(const Tensor& root, const Tensor& grad_root = Tensor());
// The same from several roots at once, one gradient each (undefined: 1 for a
// one-element root). A backward may run inside another's closure (a checkpointed
// block's); only the outermost reports leaves to a LeafGradReadyHook.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots);

// While one is alive, backward() reports each leaf (that requires grad) as soon
// as its gradient for this backward is complete (the last tape entry that uses it
// has run) and added into its buffer; data parallelism starts reducing a bucket
// of gradients then, while the rest of the backward runs. A leaf whose last use
// is not reached is not reported. Without a hook the walk does no extra work.
class LeafGradReadyHook {
 public:
  explicit LeafGradReadyHook(std::function<void(const TensorImpl*)> on_ready);
  ~LeafGradReadyHook();
  LeafGradReadyHook(const LeafGradReadyHook&) = delete;
  LeafGradReadyHook& operator=(const LeafGradReadyHook&) = delete;

 private:
  std::function<void(const TensorImpl*)> previous_;
};

size_t tape_size();
void clear_tape();
// Drops the entries recorded after the first `size` (what a checkpointed
// block's forward recorded, once its outputs are taken).
void truncate_tape(size_t size);

// The f32 buffer a leaf's gradient accumulates into, when it has one (see
// Tensor::set_grad) and no row sink, else undefined. A backward closure may add its gradient for
// that input straight into the buffer (e.g. a GEMM that accumulates) and return
// an undefined gradient for it: no temporary of the parameter's size, no extra
// pass over it. Only for leaves: anything else flows through the engine.
Tensor leaf_grad_buffer(const Tensor& t);

// A leaf held by blocks of rows (FSDP's vocabulary-sized root weights: neither
// their whole weights nor their whole f32 gradient exist during a step). An op
// that can work a block at a time reads each block's values from weight_rows
// (ops::embedding, the fused loss) and makes its gradient for the leaf block by
// block (begin_grad_block .. end_grad_block), returning none for it; any other
// gradient the engine delivers to the leaf is handed over block by block. Every
// block, in row order, on every rank that shares the leaf's sharding (the
// collectives run in weight_rows and end_grad_block).
class LeafByRows {
 public:
  virtual ~LeafByRows() = default;
  virtual int64_t block_rows() const = 0;
  // The values of rows [row0, row0 + rows) in the leaf's dtype, valid until the next call.
  virtual Tensor weight_rows(int64_t row0, int64_t rows) = 0;
  // A zeroed f32 [rows, columns] buffer for the gradient of rows [row0, row0 + rows) ...
  virtual Tensor begin_grad_block(int64_t row0, int64_t rows) = 0;
  // ... which the caller has filled: it is added into the leaf's gradient.
  virtual void end_grad_block() = 0;
};
// Sets (null: clears) how a leaf that requires grad is held by rows.
void set_leaf_by_rows(const Tensor& leaf, std::shared_ptr<LeafByRows> rows);
// The leaf's, or null (also for a non-leaf).
LeafByRows* leaf_by_rows(const Tensor& t);
// Hands a whole gradient g [rows, ...] of such a leaf over, block by block.
void add_grad_by_rows(LeafByRows& rows, const Tensor& g);

// Marks `out` (an op's output, already recorded) as one `make` can produce again
// (see Rebuild in grad_state.h); rebuild_of returns it, or null.
void set_rebuild(const Tensor& out, std::function<Tensor()> make);
std::shared_ptr<struct Rebuild> rebuild_of(const Tensor& t);

// Adds `src` into `dst` elementwise (same shape), in f32 arithmetic.
void accumulate_into(Tensor& dst, const Tensor& src);

}  // namespace tp::autograd
