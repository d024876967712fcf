#include "tp/ops/norm.h"

#include <algorithm>
#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/norm_kernels.h"
#include "tp/ops/util.h"
#include "tp/tensor/convert.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

// 1 / sqrt(mean(row^2) + eps).
float rstd_of(const float* row, int64_t h, double eps) {
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < h; ++i) ss += row[i] * row[i];
  return 1.f / std::sqrt(ss / static_cast<float>(h) + static_cast<float>(eps));
}

// rstd [R] of x [R, H].
std::vector<float> row_rstd(const float* x, int64_t rows, int64_t h, double eps) {
  std::vector<float> rstd(static_cast<size_t>(rows));
  parallel_for(rows, rows * h > 65536, [&](int64_t r) { rstd[r] = rstd_of(x + r * h, h, eps); });
  return rstd;
}

// A row at a time: every form of the norm goes through here, so they agree
// bitwise. With delta, a row is summed and normalized while still in L1.
void normalize_rows_cpu(const Tensor& x_t, const Tensor& delta_t, const Tensor& sum_t, const Tensor& w_t, double eps,
                        const Tensor& out) {
  const int64_t h = w_t.size(0), rows = h == 0 ? 0 : x_t.numel() / h;
  const float* x = x_t.data<float>();
  const float* w = w_t.data<float>();
  const float* delta = delta_t.defined() ? delta_t.data<float>() : nullptr;
  float* sum = sum_t.defined() ? sum_t.data<float>() : nullptr;
  const bool to_bf16 = out.dtype() == DType::BF16;
  parallel_region(rows * h > 65536, [&] {
    std::vector<float> row(to_bf16 ? static_cast<size_t>(h) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = x + r * h;
      if (delta != nullptr) {
        float* s = sum + r * h;
#pragma omp simd
        for (int64_t i = 0; i < h; ++i) s[i] = in[i] + delta[r * h + i];
        in = s;
      }
      float* o = to_bf16 ? row.data() : out.data<float>() + r * h;
      const float rstd = rstd_of(in, h, eps);
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) o[i] = w[i] * (in[i] * rstd);
      if (to_bf16) convert_f32_to_bf16(o, out.data<bf16>() + r * h, static_cast<size_t>(h));
    }
  });
}

void offset_weight_cpu(const Tensor& w, double offset, const Tensor& out) {
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  const auto o = static_cast<float>(offset);
  for (int64_t i = 0; i < w.numel(); ++i) dst[i] = o + src[i];
}

// xhat = x * rstd; dx = rstd * (w*g - xhat * mean(w*g*xhat)); dw = sum_rows g * xhat.
void norm_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& g, double eps, const Tensor& dx,
                       const Tensor& dw) {
  const int64_t h = w.size(0), rows = h == 0 ? 0 : x.numel() / h;
  const float* xs = x.data<float>();
  const float* ws = w.data<float>();
  const float* gs = g.data<float>();
  std::vector<float> rstd = row_rstd(xs, rows, h, eps);
  if (dx.defined()) {
    float* d = dx.data<float>();
    parallel_for(rows, rows * h > 65536, [&](int64_t r) {
      const float* xr = xs + r * h;
      const float* gr = gs + r * h;
      float dot = 0;
      for (int64_t i = 0; i < h; ++i) dot += ws[i] * gr[i] * xr[i] * rstd[r];
      float mean = dot / static_cast<float>(h);
      for (int64_t i = 0; i < h; ++i) d[r * h + i] = rstd[r] * (ws[i] * gr[i] - xr[i] * rstd[r] * mean);
    });
  }
  if (dw.defined()) {
    float* d = dw.data<float>();
    std::fill(d, d + h, 0.f);
    parallel_for((h + 63) / 64, rows * h > 65536, [&](int64_t block) {
      const int64_t i0 = block * 64, i1 = std::min(h, i0 + 64);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = i0; i < i1; ++i) d[i] += gs[r * h + i] * xs[r * h + i] * rstd[r];
    });
  }
}

constexpr NormKernels kCpuNormKernels{normalize_rows_cpu, offset_weight_cpu, norm_backward_cpu};

// ---- the ops

void check_norm_args(const Tensor& x, const Tensor& w, const char* what) {
  check_f32(x, what, "input");
  check_floating(w, what);
  TP_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1),
           "{}: weight shape {} does not match input shape {} (weight must be [last dim of input])", what,
           shape_str(w.shape()), shape_str(x.shape()));
}

// offset + w in f32 (a copy: w.to(F32) may be w itself).
Tensor offset_weight(const Tensor& w, double offset) {
  Tensor w32 = w.to(DType::F32);
  if (offset == 0.0) return w32;
  Tensor out = Tensor::empty(w32.shape());
  norm_kernels().on(w32).offset_weight(w32, offset, out);
  return out;
}

}  // namespace

KernelTable<NormKernels>& norm_kernels() {
  static KernelTable<NormKernels> table("rms_norm", &kCpuNormKernels);
  return table;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, double weight_offset) {
  check_norm_args(x, w, "rms_norm");
  Tensor w32 = offset_weight(w, weight_offset);
  Tensor out = Tensor::empty(x.shape());
  norm_kernels().on(x, w32).normalize_rows(x, Tensor(), Tensor(), w32, eps, out);
  if (autograd::needs_grad({x, w})) {
    autograd::record("rms_norm", {x, w}, {out}, [x, w, w32, eps](const std::vector<Tensor>& g) {
      // w32 is the offset weight, whose derivative by the stored one is 1.
      Tensor dx = x.requires_grad() ? Tensor::empty(x.shape()) : Tensor();
      Tensor dw = w.requires_grad() ? Tensor::empty(w32.shape()) : Tensor();
      norm_kernels().on(x, w32, g[0]).backward(x, w32, g[0], eps, dx, dw);
      return std::vector<Tensor>{dx, dw};
    });
  }
  return out;
}

namespace {

void check_inference_norm(const std::vector<Tensor>& inputs, DType out_dtype, const char* what) {
  TP_CHECK(!autograd::needs_grad(inputs), "{}: an inference form without gradients; use rms_norm (and add) to "
           "differentiate", what);
  TP_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16, "{}: out_dtype must be f32 or bf16, got {}", what,
           dtype_name(out_dtype));
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, DType out_dtype) {
  check_norm_args(x, w, "rms_norm");
  check_inference_norm({x, w}, out_dtype, "rms_norm");
  Tensor w32 = w.to(DType::F32);
  Tensor out = Tensor::empty(x.shape(), out_dtype);
  norm_kernels().on(x, w32).normalize_rows(x, Tensor(), Tensor(), w32, eps, out);
  return out;
}

AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& w, double eps, DType out_dtype) {
  check_norm_args(x, w, "add_rms_norm");
  check_f32(delta, "add_rms_norm", "delta");
  check_same_shape(x, delta, "add_rms_norm: x and delta");
  check_inference_norm({x, delta, w}, out_dtype, "add_rms_norm");
  Tensor w32 = w.to(DType::F32);
  AddRmsNorm r{Tensor::empty(x.shape()), Tensor::empty(x.shape(), out_dtype)};
  norm_kernels().on(x, delta, w32).normalize_rows(x, delta, r.sum, w32, eps, r.normed);
  return r;
}

}  // namespace tp::ops
