#include "tp/ops/norm.h"

#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/ops/util.h"
#include "tp/tensor/convert.h"

namespace tp::ops {

namespace {

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
#pragma omp parallel for schedule(static) if (rows * h > 65536)
  for (int64_t r = 0; r < rows; ++r) rstd[r] = rstd_of(x + r * h, h, eps);
  return rstd;
}

void check_norm_args(const Tensor& x, const Tensor& w, const char* what) {
  check_f32(x, what, "input");
  check_floating(w, what);
  TP_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1),
           "{}: weight shape {} does not match input shape {} (weight must be [last dim of input])", what,
           shape_str(w.shape()), shape_str(x.shape()));
}

// The rows of x normalized into `out` (f32 or bf16), a row at a time: every
// form of the norm goes through here, so they agree bitwise. With `delta`, each
// row is first summed into `sum` (x + delta), and normalized while still in L1.
void norm_rows(const float* x, const float* delta, float* sum, const float* w, int64_t rows, int64_t h, double eps,
               Tensor& out) {
  const bool to_bf16 = out.dtype() == DType::BF16;
#pragma omp parallel if (rows * h > 65536)
  {
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
  }
}

// offset + w in f32 (a copy: w.to(F32) may be w itself).
Tensor offset_weight(const Tensor& w, double offset) {
  Tensor w32 = w.to(DType::F32);
  if (offset == 0.0) return w32;
  Tensor out = Tensor::empty(w32.shape());
  const float* src = w32.data<float>();
  float* dst = out.data<float>();
  const auto o = static_cast<float>(offset);
  for (int64_t i = 0; i < w32.numel(); ++i) dst[i] = o + src[i];
  return out;
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, double weight_offset) {
  check_norm_args(x, w, "rms_norm");
  int64_t h = w.size(0), rows = h == 0 ? 0 : x.numel() / h;
  Tensor w32 = offset_weight(w, weight_offset);
  Tensor out = Tensor::empty(x.shape());
  norm_rows(x.data<float>(), nullptr, nullptr, w32.data<float>(), rows, h, eps, out);
  if (autograd::needs_grad({x, w})) {
    autograd::record("rms_norm", {x, w}, {out}, [x, w, w32, eps, rows, h](const std::vector<Tensor>& g) {
      // xhat = x * rstd; dx = rstd * (w*g - xhat * mean(w*g*xhat)); dw = sum_rows g * xhat
      // (w here the offset weight, whose derivative by the stored one is 1).
      const float* xs = x.data<float>();
      const float* ws = w32.data<float>();
      const float* gs = g[0].data<float>();
      std::vector<float> rstd = row_rstd(xs, rows, h, eps);
      Tensor dx, dw;
      if (x.requires_grad()) {
        dx = Tensor::empty(x.shape());
        float* d = dx.data<float>();
#pragma omp parallel for schedule(static) if (rows * h > 65536)
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = xs + r * h;
          const float* gr = gs + r * h;
          float dot = 0;
          for (int64_t i = 0; i < h; ++i) dot += ws[i] * gr[i] * xr[i] * rstd[r];
          float mean = dot / static_cast<float>(h);
          for (int64_t i = 0; i < h; ++i) d[r * h + i] = rstd[r] * (ws[i] * gr[i] - xr[i] * rstd[r] * mean);
        }
      }
      if (w.requires_grad()) {
        dw = Tensor::zeros({h});
        float* d = dw.data<float>();
#pragma omp parallel for schedule(static) if (rows * h > 65536)
        for (int64_t i0 = 0; i0 < h; i0 += 64) {
          int64_t i1 = std::min(h, i0 + 64);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = i0; i < i1; ++i) d[i] += gs[r * h + i] * xs[r * h + i] * rstd[r];
        }
      }
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
  int64_t h = w.size(0), rows = h == 0 ? 0 : x.numel() / h;
  Tensor w32 = w.to(DType::F32);
  Tensor out = Tensor::empty(x.shape(), out_dtype);
  norm_rows(x.data<float>(), nullptr, nullptr, w32.data<float>(), rows, h, eps, out);
  return out;
}

AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& w, double eps, DType out_dtype) {
  check_norm_args(x, w, "add_rms_norm");
  check_f32(delta, "add_rms_norm", "delta");
  check_same_shape(x, delta, "add_rms_norm: x and delta");
  check_inference_norm({x, delta, w}, out_dtype, "add_rms_norm");
  int64_t h = w.size(0), rows = h == 0 ? 0 : x.numel() / h;
  Tensor w32 = w.to(DType::F32);
  AddRmsNorm r{Tensor::empty(x.shape()), Tensor::empty(x.shape(), out_dtype)};
  norm_rows(x.data<float>(), delta.data<float>(), r.sum.data<float>(), w32.data<float>(), rows, h, eps, r.normed);
  return r;
}

}  // namespace tp::ops
