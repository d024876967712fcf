#include "tp/training/parameters.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>

#include "tp/ops/gemm.h"
#include "tp/parallel/shards.h"
#include "tp/tensor/convert.h"

namespace tp::training {

bool decays(const std::string& name) {
  static const std::regex no_decay(R"(bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.))");
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return !std::regex_search(lower, no_decay);
}

namespace {

constexpr int64_t kAlign = 16;  // elements: each parameter starts on a 64-byte boundary of the slabs

Tensor view(const Tensor& slab, int64_t offset, const Shape& shape) {
  return Tensor::wrap(slab.storage(), slab.storage_offset() + static_cast<size_t>(offset) * dtype_size(slab.dtype()),
                      shape, slab.dtype());
}

}  // namespace

ModelParameters::ModelParameters(nn::Module& model, dist::ProcessGroup& tp_group, bool bf16_compute,
                                 const std::function<bool(const std::string&)>& trainable)
    : group_(tp_group), bf16_(bf16_compute) {
  std::map<const TensorImpl*, size_t> seen;  // tied parameters share one tensor
  for (nn::Module* m : model.modules()) {
    for (nn::Parameter* p : m->own_parameters()) {
      TP_CHECK(p->data.defined(), "parameter '{}' has no data: load the model for training "
               "(LoadOptions::for_training(), which keeps the plain weights)", p->name);
      if (auto it = seen.find(p->data.impl()); it != seen.end()) {
        params_[it->second].refs.push_back(p);
        continue;
      }
      if (trainable && !trainable(p->name)) continue;
      seen[p->data.impl()] = params_.size();
      TrainableParam t;
      t.name = p->name;
      t.refs = {p};
      t.global_shape = p->global_shape;
      t.decay = decays(p->name);
      t.shards = parallel::all_shards(p->shard, group_);  // every rank walks the same tree in the same order
      t.replicated = p->shard.replicated();
      t.counted = parallel::first_holder(t.shards, group_.rank()) == group_.rank();
      params_.push_back(std::move(t));
    }
    // Training changes weights in place: a packed inference copy would go stale.
    m->release_packed_weights();
  }
  std::stable_partition(params_.begin(), params_.end(), [](const TrainableParam& p) { return p.replicated; });

  for (TrainableParam& p : params_) {
    p.offset = numel_;
    numel_ += (p.refs[0]->data.numel() + kAlign - 1) / kAlign * kAlign;
    if (p.replicated) replicated_end_ = numel_;
  }
  master_ = Tensor::zeros({numel_});
  grad_ = Tensor::zeros({numel_});
  if (bf16_) compute_bf16_ = Tensor::zeros({numel_}, DType::BF16);
  for (TrainableParam& p : params_) {
    const Tensor& loaded = p.refs[0]->data;
    p.master = view(master_, p.offset, loaded.shape());
    p.master.copy_from(loaded);
    p.grad = view(grad_, p.offset, loaded.shape());
    p.compute = bf16_ && loaded.dim() >= 2 ? view(compute_bf16_, p.offset, loaded.shape()) : p.master;
    p.compute.set_requires_grad(true);
    p.compute.set_grad(p.grad);
    for (nn::Parameter* ref : p.refs) ref->data = p.compute;
  }
  refresh_compute_weights();
}

const TrainableParam& ModelParameters::find(const std::string& name) const {
  for (const TrainableParam& p : params_) {
    if (p.name == name) return p;
    for (const nn::Parameter* ref : p.refs)
      if (ref->name == name) return p;
  }
  fail("no trainable parameter named '{}'", name);
}

void ModelParameters::zero_grad() { std::memset(grad_.raw_data(), 0, grad_.nbytes()); }

void ModelParameters::refresh_compute_weights() {
  if (!bf16_) return;
  for (TrainableParam& p : params_)
    if (p.compute.dtype() == DType::BF16)
      ops::detail::to_bf16_parallel(p.master.data<float>(), p.compute.data<bf16>(), static_cast<size_t>(p.master.numel()));
}

void ModelParameters::sync_replicated_grads() {
  if (group_.size() == 1 || replicated_end_ == 0) return;
  Tensor replicated = grad_.narrow(0, 0, replicated_end_);
  group_.broadcast(replicated, 0);
}

double ModelParameters::global_grad_norm() const {
  double mine = 0;
  for (const TrainableParam& p : params_) {
    if (!p.counted) continue;
    const float* g = p.grad.data<float>();
    const int64_t n = p.grad.numel();
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
    mine += s;
  }
  // Every rank adds the same partial sums in the same order: the same bits everywhere.
  int64_t bits;
  std::memcpy(&bits, &mine, sizeof bits);
  std::vector<int64_t> all = group_.all_gather(Tensor::from_ints({bits}, {1}), 0).to_int_vector();
  double total = 0;
  for (int64_t b : all) {
    double part;
    std::memcpy(&part, &b, sizeof part);
    total += part;
  }
  return std::sqrt(total);
}

void ModelParameters::scale_grads(float factor) {
  float* g = grad_.data<float>();
#pragma omp parallel for simd schedule(static) if (numel_ > 65536)
  for (int64_t i = 0; i < numel_; ++i) g[i] *= factor;
}

Tensor ModelParameters::gather_master(const TrainableParam& p) const {
  return parallel::gather_full(p.master, p.global_shape, p.shards, group_);
}

}  // namespace tp::training
