#include "tp/ops/dropout.h"

#include "tp/ops/detail/dropout_kernels.h"
#include "tp/tensor/random.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

void mask_cpu(double p, uint64_t stream, const DropoutWindow& window, const Tensor& m) {
  const Shape& shape = m.shape();
  const int64_t cols = shape.empty() ? 1 : shape.back(), rows = cols == 0 ? 0 : numel(shape) / cols;
  float* out = m.data<float>();
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const auto index = static_cast<uint64_t>((window.first_row + i) * window.full_cols + window.first_col + j);
      out[i * cols + j] = uniform01(stream, index) >= p ? keep : 0.f;
    }
}

constexpr DropoutKernels kCpuDropoutKernels{mask_cpu};

}  // namespace

KernelTable<DropoutKernels>& dropout_kernels() {
  static KernelTable<DropoutKernels> table("dropout_mask", &kCpuDropoutKernels);
  return table;
}

Tensor dropout_mask(const Shape& shape, double p, uint64_t stream, const DropoutWindow& window) {
  TP_CHECK(p >= 0 && p < 1, "dropout_mask: p must be in [0, 1), got {}", p);
  Tensor m = Tensor::empty(shape);
  dropout_kernels().on(m).mask(p, stream, window, m);
  return m;
}

}  // namespace tp::ops
