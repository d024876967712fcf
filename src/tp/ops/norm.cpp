#include "tp/ops/norm.h"

#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/ops/util.h"

namespace tp::ops {

namespace {

// rstd [R] of x [R, H].
std::vector<float> row_rstd(const float* x, int64_t rows, int64_t h, double eps) {
  std::vector<float> rstd(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if (rows * h > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * h;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < h; ++i) ss += row[i] * row[i];
    rstd[r] = 1.f / std::sqrt(ss / static_cast<float>(h) + static_cast<float>(eps));
  }
  return rstd;
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  check_f32(x, "rms_norm", "input");
  check_floating(w, "rms_norm");
  TP_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1),
           "rms_norm: weight shape {} does not match input shape {} (weight must be [last dim of input])",
           shape_str(w.shape()), shape_str(x.shape()));
  int64_t h = w.size(0), rows = h == 0 ? 0 : x.numel() / h;
  Tensor w32 = w.to(DType::F32);
  Tensor out = Tensor::empty(x.shape());
  const float* xs = x.data<float>();
  const float* ws = w32.data<float>();
  float* o = out.data<float>();
  std::vector<float> rstd = row_rstd(xs, rows, h, eps);
#pragma omp parallel for schedule(static) if (rows * h > 65536)
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t i = 0; i < h; ++i) o[r * h + i] = ws[i] * (xs[r * h + i] * rstd[r]);
  }
  if (autograd::needs_grad({x, w})) {
    autograd::record("rms_norm", {x, w}, {out}, [x, w, w32, eps, rows, h](const std::vector<Tensor>& g) {
      // xhat = x * rstd; dx = rstd * (w*g - xhat * mean(w*g*xhat)); dw = sum_rows g * xhat.
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

}  // namespace tp::ops
