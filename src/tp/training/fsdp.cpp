#include "tp/training/fsdp.h"

#include <algorithm>
#include <functional>

#include "tp/autograd/tape.h"

namespace tp::training {

namespace {

// h itself, through a recorded identity whose backward calls `act` when the
// backward reaches that point, then passes the gradient on (h unchanged where
// nothing is recorded).
Tensor on_backward(const char* name, const Tensor& h, std::function<void()> act) {
  if (!autograd::needs_grad({h})) return h;
  Tensor out = Tensor::wrap(h.storage(), h.storage_offset(), h.shape(), h.dtype());
  autograd::record(name, {h}, {out}, [act = std::move(act)](const std::vector<Tensor>& g) {
    act();
    return std::vector<Tensor>{g[0]};
  });
  return out;
}

// One root matrix held by rows: each block of its weights all-gathered into the
// shared buffers when an op reads it, and each block of its gradient made in the
// shared gradient buffer and summed into this rank's chunks before the next.
class RootMatrixByRows : public autograd::LeafByRows {
 public:
  RootMatrixByRows(ModelParameters& params, const TrainableParam& p, dist::ProcessGroup& replicate,
                   const int64_t& block_bytes, RowBuffers& buffers)
      : params_(params), p_(p), replicate_(replicate), block_bytes_(block_bytes), buffers_(buffers),
        cols_(p.grad.size(1)) {}
  int64_t block_rows() const override { return std::max<int64_t>(1, block_bytes_ / (4 * std::max<int64_t>(cols_, 1))); }
  Tensor weight_rows(int64_t row0, int64_t rows) override {
    return params_.weight_rows(p_, row0, rows, buffers_.scratch, buffers_.weights);
  }
  Tensor begin_grad_block(int64_t row0, int64_t rows) override {
    TP_CHECK(rows >= 1 && rows <= block_rows(), "FSDP: a block of {} rows of '{}' (blocks hold at most {})", rows,
             p_.name, block_rows());
    Tensor& buffer = buffers_.grad;
    // As large as the largest block (no larger than the matrix), taken once.
    const int64_t largest = std::min(block_rows(), p_.grad.size(0)) * cols_;
    if (!buffer.defined() || buffer.numel() < rows * cols_) buffer = Tensor::empty({std::max(largest, rows * cols_)});
    row0_ = row0;
    block_ = buffer.narrow(0, 0, rows * cols_).reshape({rows, cols_});
    block_.fill(0);
    return block_;
  }
  void end_grad_block() override {
    params_.add_grad_rows(p_, row0_, block_, replicate_);
    block_ = Tensor();
  }

 private:
  ModelParameters& params_;
  const TrainableParam& p_;
  dist::ProcessGroup& replicate_;
  const int64_t& block_bytes_;
  RowBuffers& buffers_;
  const int64_t cols_;
  int64_t row0_ = 0;
  Tensor block_;
};

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(ModelParameters& params, dist::ProcessGroup& replicate,
                                                   bool reshard_after_forward)
    : FullyShardedDataParallel(params, &replicate, reshard_after_forward) {
  TP_CHECK(params_.fully_sharded(), "FullyShardedDataParallel: the parameters are not fully sharded");
}

FullyShardedDataParallel::FullyShardedDataParallel(ModelParameters& params)
    : FullyShardedDataParallel(params, nullptr, true) {
  TP_CHECK(!params_.fully_sharded(), "FullyShardedDataParallel: fully sharded parameters need their dp_replicate group");
}

FullyShardedDataParallel::FullyShardedDataParallel(ModelParameters& params, dist::ProcessGroup* replicate,
                                                   bool reshard_after_forward)
    : params_(params), replicate_(replicate), reshard_after_forward_(reshard_after_forward) {
  TP_CHECK(params_.computes_by_unit(), "FullyShardedDataParallel: the parameters are neither fully sharded nor held "
           "by unit (FullyShardOptions)");
  const std::vector<ParamUnit>& units = params_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].id < 0) {
      root_ = static_cast<int64_t>(u);
      continue;
    }
    if (static_cast<int64_t>(layer_unit_.size()) <= units[u].id) layer_unit_.resize(units[u].id + 1, -1);
    layer_unit_[units[u].id] = static_cast<int64_t>(u);
  }
  comm_clock_ = collective_seconds();
  for (const TrainableParam& p : params_.params()) {
    if (!p.grad_by_rows) continue;
    autograd::set_leaf_by_rows(p.compute, std::make_shared<RootMatrixByRows>(params_, p, *replicate_, row_block_bytes_, rows_));
    sunk_.push_back(p.compute);
  }
}

void FullyShardedDataParallel::set_row_block_bytes(int64_t bytes) {
  TP_CHECK(bytes > 0, "FSDP: the root's gradient blocks need a positive size, got {} bytes", bytes);
  row_block_bytes_ = bytes;
  rows_ = {};
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (const Tensor& w : sunk_) autograd::set_leaf_by_rows(w, nullptr);
}

int64_t FullyShardedDataParallel::unit_of_layer(int64_t layer) const {
  return layer < static_cast<int64_t>(layer_unit_.size()) ? layer_unit_[layer] : -1;
}

void FullyShardedDataParallel::gather(size_t u) {
  if (params_.unit_gathered(u)) return;
  params_.gather_unit(u, /*rows=*/false);  // the root's matrices are read a block at a time
  ++gathers_;
  int64_t layers = 0;
  for (int64_t v : layer_unit_) layers += v >= 0 && params_.unit_gathered(v) ? 1 : 0;
  max_gathered_layers_ = std::max(max_gathered_layers_, layers);
  note_gathered_bytes();
}

void FullyShardedDataParallel::begin_grads(size_t u) {
  if (params_.unit_grads_live(u)) return;
  params_.begin_unit_grads(u);
  note_gathered_bytes();
}

int64_t FullyShardedDataParallel::row_buffer_bytes() const {
  int64_t bytes = 0;
  for (const Tensor* t : {&rows_.scratch, &rows_.weights, &rows_.grad})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

void FullyShardedDataParallel::note_gathered_bytes() {
  int64_t bytes = row_buffer_bytes();
  for (const ParamUnit& unit : params_.units()) {
    if (!unit.compute->released()) bytes += static_cast<int64_t>(unit.compute->bytes());
    if (unit.grad != nullptr && !unit.grad->released()) bytes += static_cast<int64_t>(unit.grad->bytes());
  }
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, bytes);
}

void FullyShardedDataParallel::reduce(size_t u) {
  note_gathered_bytes();  // the backward's blocks' buffer has been taken by now
  if (replicate_ != nullptr) params_.reduce_unit_grads(u, *replicate_);  // else the gradients are in the slab
  params_.release_unit(u);
}

void FullyShardedDataParallel::begin_forward() {
  if (root_ >= 0) gather(root_);
}

Tensor FullyShardedDataParallel::leave_embedding(const Tensor& h) {
  if (root_ < 0) return h;
  // The embedding's backward, the last of all, adds into the root's gradient
  // (it reads no weight); finish() reduces it.
  Tensor out = on_backward("fsdp_embedding_pre_backward", h, [this] {
    begin_grads(root_);
  });
  if (reshard_after_forward_ || !autograd::is_grad_enabled()) params_.release_unit(root_);
  return out;
}

Tensor FullyShardedDataParallel::enter_head(const Tensor& h) {
  if (root_ < 0) return h;
  gather(root_);
  if (autograd::needs_grad({h})) begin_grads(root_);
  // Runs once lm_head's and the final norm's backward are done.
  return on_backward("fsdp_head_post_backward", h, [this] { reduce(root_); });
}

Tensor FullyShardedDataParallel::enter_layer(int64_t layer, const Tensor& h) {
  const int64_t u = unit_of_layer(layer);
  if (u < 0) return h;
  gather(u);
  // Runs once the backward has been through the whole layer: its gradients are
  // complete (unrecorded when h needs no gradient: finish() reduces it then).
  return on_backward("fsdp_post_backward", h, [this, u] { reduce(u); });
}

Tensor FullyShardedDataParallel::leave_layer(int64_t layer, const Tensor& h) {
  const int64_t u = unit_of_layer(layer);
  if (u < 0) return h;
  // Runs before anything of the layer's backward.
  Tensor out = on_backward("fsdp_pre_backward", h, [this, u] {
    gather(u);
    begin_grads(u);
  });
  if (reshard_after_forward_ || !autograd::is_grad_enabled()) params_.release_unit(u);
  return out;
}

std::unique_ptr<autograd::LeafGradReadyHook> FullyShardedDataParallel::watch_backward() const {
  return std::make_unique<autograd::LeafGradReadyHook>([](const TensorImpl*) {});
}

void FullyShardedDataParallel::finish() {
  // The same units on every rank, in the backward's order (the root last).
  for (int64_t l = static_cast<int64_t>(layer_unit_.size()) - 1; l >= 0; --l) {
    const int64_t u = layer_unit_[l];
    if (u >= 0 && params_.unit_grads_live(u)) reduce(u);
  }
  if (root_ >= 0 && params_.unit_grads_live(root_)) reduce(root_);
  release();
}

void FullyShardedDataParallel::release() {
  for (size_t u = 0; u < params_.units().size(); ++u) params_.release_unit(u);
}

int64_t FullyShardedDataParallel::take_gathers() {
  const int64_t n = gathers_;
  gathers_ = 0;
  return n;
}

double FullyShardedDataParallel::collective_seconds() const {
  const dist::ProcessGroup* shard = params_.shard_group();  // none for units without sharding
  return (replicate_ != nullptr ? replicate_->collective_seconds() : 0.0) +
         (shard != nullptr ? shard->collective_seconds() : 0.0);
}

double FullyShardedDataParallel::take_communication_seconds() {
  const double now = collective_seconds();
  const double s = now - comm_clock_;
  comm_clock_ = now;
  return s;
}

}  // namespace tp::training
