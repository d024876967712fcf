#include "tp/training/optimizer.h"

#include <cmath>

#include "tp/tensor/convert.h"

namespace tp::training {

namespace {

// Elements per task: the update of one block and its bf16 rounding stay in cache.
constexpr int64_t kBlock = 4096;

// Runs `update(begin, end)` over every parameter's elements in blocks, split over
// threads, then rounds the block's new masters into the bf16 compute copy.
template <class Update>
void for_each_block(ModelParameters& params, Update update) {
  for (TrainableParam& p : params.params()) {
    const int64_t n = p.master.numel(), blocks = (n + kBlock - 1) / kBlock;
    const bool round = p.compute.dtype() == DType::BF16;
#pragma omp parallel for schedule(static) if (blocks > 16)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
      update(p, begin, end);
      if (round)
        convert_f32_to_bf16(p.master.data<float>() + begin, p.compute.data<bf16>() + begin,
                            static_cast<size_t>(end - begin));
    }
  }
}

Tensor slab_view(const Tensor& slab, const TrainableParam& p) {
  return slab.narrow(0, p.offset, p.master.numel()).reshape(p.master.shape());
}

std::vector<std::pair<std::string, Tensor>> views_of(const ModelParameters& params, const Tensor& slab,
                                                     const std::string& suffix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TrainableParam& p : params.params()) out.emplace_back(p.name + "." + suffix, slab_view(slab, p));
  return out;
}

void load_views(const ModelParameters& params, Tensor& slab, const std::string& suffix,
                const std::vector<std::pair<std::string, Tensor>>& state) {
  for (const TrainableParam& p : params.params()) {
    const std::string key = p.name + "." + suffix;
    const Tensor* found = nullptr;
    for (const auto& [name, t] : state)
      if (name == key) found = &t;
    TP_CHECK(found != nullptr, "optimizer state has no '{}'", key);
    TP_CHECK(found->shape() == p.master.shape(), "optimizer state '{}' has shape {}, the parameter's shard is {}",
             key, shape_str(found->shape()), shape_str(p.master.shape()));
    Tensor dst = slab_view(slab, p);
    dst.copy_from(*found);
  }
}

}  // namespace

AdamW::AdamW(ModelParameters& params, AdamWOptions options)
    : params_(params), o_(options), exp_avg_(Tensor::zeros({params.numel()})),
      exp_avg_sq_(Tensor::zeros({params.numel()})) {}

void AdamW::step(double lr) {
  ++steps_;
  const double t = static_cast<double>(steps_);
  const float beta1 = static_cast<float>(o_.beta1), beta2 = static_cast<float>(o_.beta2);
  const float one_minus_beta1 = static_cast<float>(1 - o_.beta1), one_minus_beta2 = static_cast<float>(1 - o_.beta2);
  const float step_size = static_cast<float>(lr / (1 - std::pow(o_.beta1, t)));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(o_.beta2, t)));
  const float eps = static_cast<float>(o_.eps);
  float* m = exp_avg_.data<float>();
  float* v = exp_avg_sq_.data<float>();
  for_each_block(params_, [&](TrainableParam& p, int64_t begin, int64_t end) {
    const float keep = static_cast<float>(1 - lr * (p.decay ? o_.weight_decay : 0.0));
    float* w = p.master.data<float>();
    const float* g = p.grad.data<float>();
    float* pm = m + p.offset;
    float* pv = v + p.offset;
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      w[i] *= keep;
      pm[i] = pm[i] * beta1 + one_minus_beta1 * g[i];
      pv[i] = pv[i] * beta2 + one_minus_beta2 * g[i] * g[i];
      const float denom = std::sqrt(pv[i]) / bias_correction2_sqrt + eps;
      w[i] -= step_size * pm[i] / denom;
    }
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
  if (o_.momentum != 0) momentum_buffer_ = Tensor::zeros({params.numel()});
}

void SGD::step(double lr) {
  const bool first = steps_ == 0;
  ++steps_;
  const float rate = static_cast<float>(lr), mu = static_cast<float>(o_.momentum);
  float* buf = momentum_buffer_.defined() ? momentum_buffer_.data<float>() : nullptr;
  for_each_block(params_, [&](TrainableParam& p, int64_t begin, int64_t end) {
    const float lambda = static_cast<float>(p.decay ? o_.weight_decay : 0.0);
    float* w = p.master.data<float>();
    const float* g = p.grad.data<float>();
    float* b = buf ? buf + p.offset : nullptr;
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      float d = g[i] + lambda * w[i];
      if (b) d = b[i] = first ? d : mu * b[i] + d;
      w[i] -= rate * d;
    }
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
