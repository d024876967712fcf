#include "tp/training/optimizer.h"

#include <cmath>

#include "tp/ops/optimizer_updates.h"

namespace tp::training {

namespace {

// Runs `update(p, w, g, state, compute)` over the elements this rank owns of
// every parameter (all of them unless the updates are sharded), a segment at a
// time: w and g its masters and gradients, its optimizer state from `state`, and
// the part of the bf16 compute copy the update rounds its new masters into
// (undefined: none, or held by unit (FSDP or not): the unit's next gather does).
template <class Update>
void for_each_segment(ModelParameters& params, Update update) {
  for (TrainableParam& p : params.params())
    for (const OwnedSegment& seg : p.owned)
      update(p, params.owned_master(p, seg), params.owned_grad(p, seg), seg.state,
             params.computes_by_unit() ? Tensor() : compute_copy_of(p, seg));
}

Tensor slab_view(const Tensor& slab, const TrainableParam& p) {
  return slab.narrow(0, p.offset, p.grad.numel()).reshape(p.grad.shape());
}

// Each parameter's state as a tensor of its local shape (gathered over the shard
// group when sharded: checkpoints hold the same files whatever the sharding).
std::vector<std::pair<std::string, Tensor>> views_of(const ModelParameters& params, const Tensor& state,
                                                     const std::string& suffix) {
  const Tensor slab = params.state_to_full(state);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TrainableParam& p : params.params()) out.emplace_back(p.name + "." + suffix, slab_view(slab, p));
  return out;
}

void load_views(const ModelParameters& params, Tensor& state_slab, const std::string& suffix,
                const std::vector<std::pair<std::string, Tensor>>& state) {
  Tensor slab = params.updates_sharded() ? Tensor::zeros({params.numel()}) : state_slab;
  for (const TrainableParam& p : params.params()) {
    const std::string key = p.name + "." + suffix;
    const Tensor* found = nullptr;
    for (const auto& [name, t] : state)
      if (name == key) found = &t;
    TP_CHECK(found != nullptr, "optimizer state has no '{}'", key);
    TP_CHECK(found->shape() == p.grad.shape(), "optimizer state '{}' has shape {}, the parameter's shard is {}",
             key, shape_str(found->shape()), shape_str(p.grad.shape()));
    Tensor dst = slab_view(slab, p);
    dst.copy_from(*found);
  }
  params.state_from_full(slab, state_slab);
}

}  // namespace

AdamW::AdamW(ModelParameters& params, AdamWOptions options)
    : params_(params), o_(options), exp_avg_(Tensor::zeros({params.state_numel()})),
      exp_avg_sq_(Tensor::zeros({params.state_numel()})) {}

void AdamW::step(double lr, float grad_scale) {
  ++steps_;
  const double t = static_cast<double>(steps_);
  ops::AdamWScalars c{1.f,
                 static_cast<float>(o_.beta1),
                 static_cast<float>(1 - o_.beta1),
                 static_cast<float>(o_.beta2),
                 static_cast<float>(1 - o_.beta2),
                 static_cast<float>(std::sqrt(1 - std::pow(o_.beta2, t))),
                 static_cast<float>(o_.eps),
                 static_cast<float>(lr / (1 - std::pow(o_.beta1, t))),
                 grad_scale};
  for_each_segment(params_, [&](TrainableParam& p, const Tensor& w, const Tensor& g, int64_t state,
                               const Tensor& compute) {
    ops::AdamWScalars pc = c;
    pc.keep = static_cast<float>(1 - lr * (p.decay ? o_.weight_decay : 0.0));
    ops::adamw_update(pc, w, g, exp_avg_.narrow(0, state, w.numel()), exp_avg_sq_.narrow(0, state, w.numel()),
                      compute);
  });
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out = views_of(params_, exp_avg_, "exp_avg");
  for (auto& e : views_of(params_, exp_avg_sq_, "exp_avg_sq")) out.push_back(std::move(e));
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  load_views(params_, exp_avg_, "exp_avg", state);
  load_views(params_, exp_avg_sq_, "exp_avg_sq", state);
  steps_ = steps;
}

SGD::SGD(ModelParameters& params, SGDOptions options) : params_(params), o_(options) {
  if (o_.momentum != 0) momentum_buffer_ = Tensor::zeros({params.state_numel()});
}

void SGD::step(double lr, float grad_scale) {
  const bool first = steps_ == 0;
  ++steps_;
  const float rate = static_cast<float>(lr), mu = static_cast<float>(o_.momentum);
  for_each_segment(params_, [&](TrainableParam& p, const Tensor& w, const Tensor& g, int64_t state,
                               const Tensor& compute) {
    const float lambda = static_cast<float>(p.decay ? o_.weight_decay : 0.0);
    ops::sgd_update({.rate = rate, .momentum = mu, .weight_decay = lambda, .grad_scale = grad_scale, .first = first},
                    w, g, momentum_buffer_.defined() ? momentum_buffer_.narrow(0, state, w.numel()) : Tensor(),
                    compute);
  });
}

std::vector<std::pair<std::string, Tensor>> SGD::state() const {
  if (!momentum_buffer_.defined()) return {};
  return views_of(params_, momentum_buffer_, "momentum_buffer");
}

void SGD::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  if (momentum_buffer_.defined()) load_views(params_, momentum_buffer_, "momentum_buffer", state);
  steps_ = steps;
}

}  // namespace tp::training
