#include "tp/nn/fused_linears.h"

namespace tp::nn {

void FusedLinears::fuse(const std::vector<Linear*>& parts) {
  release();
  if (parts.size() < 2) return;
  const Tensor& first = parts[0]->weight.data;
  if (!first.defined() || (first.dtype() != DType::F32 && first.dtype() != DType::BF16)) return;
  for (Linear* p : parts) {
    const Tensor& w = p->weight.data;
    // A shared weight (a tied one) stays with its module: the other owner reads it.
    if (!w.defined() || w.dim() != 2 || w.dtype() != first.dtype() || w.size(1) != first.size(1) || w.numel() == 0 ||
        p->bias != nullptr || p->fused() || w.impl_ptr().use_count() > 1)
      return;
  }
  std::vector<Tensor> weights;
  for (Linear* p : parts) weights.push_back(p->weight.data);
  packed_ = ops::pack_stacked(weights);
  for (Linear* p : parts) p->mark_fused(first.dtype());
  parts_ = parts;
}

bool FusedLinears::active() const {
  if (parts_.empty()) return false;
  for (const Linear* p : parts_)
    if (!p->fused()) return false;
  return true;
}

bool FusedLinears::takes_bf16_input() const {
  if (!active()) return false;
  for (const Linear* p : parts_)
    if (!p->takes_bf16_input()) return false;
  return true;
}

std::vector<Tensor> FusedLinears::forward(const Tensor& x) {
  TP_CHECK(active(), "FusedLinears::forward: not fused (or a part was released since)");
  Tensor y = ops::linear(x, packed_);
  std::vector<Tensor> out;
  const int64_t last = y.dim() - 1;
  int64_t at = 0;
  for (Linear* p : parts_) {
    const int64_t n = local_shape(p->weight)[0];
    Tensor part = y.narrow(last, at, n);  // a view at decode (one row), a copy for more rows
    at += n;
    out.push_back(p->adapter() != nullptr ? p->adapter()->forward(x, part) : part);
  }
  return out;
}

void FusedLinears::release() {
  packed_ = ops::PackedLinear();
  parts_.clear();
}

}  // namespace tp::nn
