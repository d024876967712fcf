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

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(ModelParameters& params, dist::ProcessGroup& replicate,
                                                   bool reshard_after_forward)
    : params_(params), replicate_(replicate), reshard_after_forward_(reshard_after_forward) {
  TP_CHECK(params_.fully_sharded(), "FullyShardedDataParallel: the parameters are not fully sharded");
  const std::vector<ParamUnit>& units = params_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].id < 0) {
      root_ = static_cast<int64_t>(u);
      continue;
    }
    if (static_cast<int64_t>(layer_unit_.size()) <= units[u].id) layer_unit_.resize(units[u].id + 1, -1);
    layer_unit_[units[u].id] = static_cast<int64_t>(u);
  }
  comm_clock_ = replicate_.collective_seconds() + params_.shard_group()->collective_seconds();
}

int64_t FullyShardedDataParallel::unit_of_layer(int64_t layer) const {
  return layer < static_cast<int64_t>(layer_unit_.size()) ? layer_unit_[layer] : -1;
}

void FullyShardedDataParallel::gather(size_t u) {
  if (params_.unit_gathered(u)) return;
  params_.gather_unit(u);
  ++gathers_;
  int64_t layers = 0;
  for (int64_t v : layer_unit_) layers += v >= 0 && params_.unit_gathered(v) ? 1 : 0;
  max_gathered_layers_ = std::max(max_gathered_layers_, layers);
}

void FullyShardedDataParallel::reduce(size_t u) {
  params_.reduce_unit_grads(u, replicate_);
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
    if (!params_.unit_grads_live(root_)) params_.begin_unit_grads(root_);
  });
  if (reshard_after_forward_ || !autograd::is_grad_enabled()) params_.release_unit(root_);
  return out;
}

Tensor FullyShardedDataParallel::enter_head(const Tensor& h) {
  if (root_ < 0) return h;
  gather(root_);
  if (autograd::needs_grad({h}) && !params_.unit_grads_live(root_)) params_.begin_unit_grads(root_);
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
    if (!params_.unit_grads_live(u)) params_.begin_unit_grads(u);
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

double FullyShardedDataParallel::take_communication_seconds() {
  const double now = replicate_.collective_seconds() + params_.shard_group()->collective_seconds();
  const double s = now - comm_clock_;
  comm_clock_ = now;
  return s;
}

}  // namespace tp::training
