#pragma once
// Optimizers over a rank's local shards (ModelParameters' slabs): every rank
// updates only what it owns (all it holds, or its dp_shard part), so no communication. The math is torch.optim's,
// element for element, in f32 like torch on f32 parameters:
//   AdamW (torch.optim.AdamW, amsgrad off), step t = 1, 2, ...:
//     w *= 1 - lr·λ                       (decoupled decay first; λ = 0 for no-decay params)
//     m = β1·m + (1 − β1)·g
//     v = β2·v + (1 − β2)·g²
//     w -= lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
//   SGD (torch.optim.SGD, dampening 0, no Nesterov):
//     g += λ·w;  b = g (first step) or μ·b + g;  w -= lr·b   (b = g when μ = 0)
// Under mixed precision each update also rounds the new master into the bf16
// compute copy while the values are in cache.
#include <memory>
#include <string>
#include <vector>

#include "tp/training/parameters.h"

namespace tp::training {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // `grad_scale` multiplies every gradient first (clipping's coefficient, fused
  // into the update instead of a pass of its own: the same numbers as scaling
  // the gradients in place, as torch's clip_grad_norm_ does).
  virtual void step(double lr, float grad_scale = 1.f) = 0;
  virtual std::string name() const = 0;
  int64_t steps() const { return steps_; }
  // Bytes of optimizer state this rank holds (what sharding over dp_shard divides).
  virtual int64_t state_bytes() const = 0;
  // This rank's state as named local tensors (for checkpoints), and back.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) = 0;

 protected:
  int64_t steps_ = 0;
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

class AdamW : public Optimizer {
 public:
  AdamW(ModelParameters& params, AdamWOptions options);
  void step(double lr, float grad_scale = 1.f) override;
  std::string name() const override { return "adamw_torch"; }
  int64_t state_bytes() const override { return static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes()); }
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) override;

 private:
  ModelParameters& params_;
  AdamWOptions o_;
  Tensor exp_avg_, exp_avg_sq_;  // slabs laid out like the parameters'
};

struct SGDOptions {
  double momentum = 0.0, weight_decay = 0.0;
};

class SGD : public Optimizer {
 public:
  SGD(ModelParameters& params, SGDOptions options);
  void step(double lr, float grad_scale = 1.f) override;
  std::string name() const override { return "sgd"; }
  int64_t state_bytes() const override {
    return momentum_buffer_.defined() ? static_cast<int64_t>(momentum_buffer_.nbytes()) : 0;
  }
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) override;

 private:
  ModelParameters& params_;
  SGDOptions o_;
  Tensor momentum_buffer_;  // empty without momentum
};

}  // namespace tp::training
