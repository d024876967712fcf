#include "tp/ops/activation.h"

#include <algorithm>
#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/activation_kernels.h"
#include "tp/ops/util.h"
#include "tp/ops/vec.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

inline float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }
inline float silu_f(float v) { return v * sigmoid(v); }
// d silu / dv = s + v s (1 - s)
inline float silu_grad(float v) {
  float s = sigmoid(v);
  return s * (1.f + v * (1.f - s));
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

inline float gelu_erf(float v) { return 0.5f * v * (1.f + std::erf(v * kInvSqrt2)); }
inline float gelu_erf_grad(float v) {
  return 0.5f * (1.f + std::erf(v * kInvSqrt2)) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v);
}
inline float gelu_tanh(float v) {
  float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
  return 0.5f * v * (1.f + std::tanh(u));
}
inline float gelu_tanh_grad(float v) {
  float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
  float t = std::tanh(u);
  return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * 0.044715f * v * v);
}

void silu_cpu(const Tensor& x, const Tensor& out) { map_f32(x, out, silu_f); }

void silu_backward_cpu(const Tensor& x, const Tensor& g, const Tensor& dx) {
  zip_f32(g, x, dx, [](float gv, float v) { return gv * silu_grad(v); });
}

void gelu_cpu(const Tensor& x, bool tanh_approximation, const Tensor& out) {
  if (tanh_approximation)
    map_f32(x, out, gelu_tanh);
  else
    map_f32(x, out, gelu_erf);
}

void gelu_backward_cpu(const Tensor& x, const Tensor& g, bool tanh_approximation, const Tensor& dx) {
  if (tanh_approximation)
    zip_f32(g, x, dx, [](float gv, float v) { return gv * gelu_tanh_grad(v); });
  else
    zip_f32(g, x, dx, [](float gv, float v) { return gv * gelu_erf_grad(v); });
}

void swiglu_cpu(const Tensor& a, const Tensor& b, const Tensor& out) {
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* o = out.data<float>();
  const auto& vk = detail::vec_kernels();
  const int64_t n = a.numel(), chunk = 16384;
  parallel_region(n > 4 * chunk, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i += chunk) vk.swiglu(x + i, y + i, o + i, std::min(chunk, n - i));
  });
}

// One vectorized pass for both gradients (three scalar-exp passes before: ~2% of a training step).
void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& da, const Tensor& db) {
  const float* u = a.data<float>();
  const float* v = b.data<float>();
  const float* gv = g.data<float>();
  float* pa = da.defined() ? da.data<float>() : nullptr;
  float* pb = db.defined() ? db.data<float>() : nullptr;
  const auto& vk = detail::vec_kernels();
  const int64_t n = a.numel(), chunk = 16384;
  parallel_region(n > 4 * chunk, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i += chunk)
      vk.swiglu_backward(u + i, v + i, gv + i, pa ? pa + i : nullptr, pb ? pb + i : nullptr, std::min(chunk, n - i));
  });
}

void softcap_cpu(const Tensor& x, float c, const Tensor& out) {
  map_f32(x, out, [c](float v) { return c * std::tanh(v / c); });
}

// dy/dx = 1 - tanh^2(x / cap) = 1 - (y / cap)^2.
void softcap_backward_cpu(const Tensor& y, const Tensor& g, float c, const Tensor& dx) {
  zip_f32(g, y, dx, [c](float gv, float yv) {
    const float t = yv / c;
    return gv * (1.f - t * t);
  });
}

void softmax_cpu(const Tensor& x, int64_t dim, const Tensor& out) {
  DimSplit ax = split_at(x.shape(), dim);
  const float* s = x.data<float>();
  float* o = out.data<float>();
  parallel_region(x.numel() > 16384, [&] {
#pragma omp for collapse(2) schedule(static)
    for (int64_t a = 0; a < ax.outer; ++a) {
      for (int64_t c = 0; c < ax.inner; ++c) {
        const float* row = s + a * ax.n * ax.inner + c;
        float* orow = o + a * ax.n * ax.inner + c;
        float mx = -INFINITY;
        for (int64_t i = 0; i < ax.n; ++i) mx = std::max(mx, row[i * ax.inner]);
        float total = 0;
        for (int64_t i = 0; i < ax.n; ++i) {
          float e = std::exp(row[i * ax.inner] - mx);
          orow[i * ax.inner] = e;
          total += e;
        }
        float inv = 1.f / total;
        for (int64_t i = 0; i < ax.n; ++i) orow[i * ax.inner] *= inv;
      }
    }
  });
}

// dx = y * (g - sum(g * y)) along the axis.
void softmax_backward_cpu(const Tensor& out, const Tensor& g, int64_t dim, const Tensor& dx) {
  DimSplit ax = split_at(out.shape(), dim);
  const float* y = out.data<float>();
  const float* gg = g.data<float>();
  float* d = dx.data<float>();
  parallel_region(out.numel() > 16384, [&] {
#pragma omp for collapse(2) schedule(static)
    for (int64_t a = 0; a < ax.outer; ++a) {
      for (int64_t c = 0; c < ax.inner; ++c) {
        int64_t base = a * ax.n * ax.inner + c;
        float dot = 0;
        for (int64_t i = 0; i < ax.n; ++i) dot += gg[base + i * ax.inner] * y[base + i * ax.inner];
        for (int64_t i = 0; i < ax.n; ++i)
          d[base + i * ax.inner] = y[base + i * ax.inner] * (gg[base + i * ax.inner] - dot);
      }
    }
  });
}

constexpr ActivationKernels kCpuActivationKernels{silu_cpu,    silu_backward_cpu,    gelu_cpu,    gelu_backward_cpu,
                                                  swiglu_cpu,  swiglu_backward_cpu,  softcap_cpu, softcap_backward_cpu,
                                                  softmax_cpu, softmax_backward_cpu};

}  // namespace

KernelTable<ActivationKernels>& activation_kernels() {
  static KernelTable<ActivationKernels> table("activation", &kCpuActivationKernels);
  return table;
}

Tensor silu(const Tensor& x) {
  check_f32(x, "silu", "input");
  Tensor out = Tensor::empty(x.shape());
  activation_kernels().on(x).silu(x, out);
  if (autograd::needs_grad({x})) {
    autograd::record("silu", {x}, {out}, [x](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::empty(g[0].shape());
      activation_kernels().on(x, g[0]).silu_backward(x, g[0], dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor gelu(const Tensor& x, bool tanh_approximation) {
  check_f32(x, "gelu", "input");
  Tensor out = Tensor::empty(x.shape());
  activation_kernels().on(x).gelu(x, tanh_approximation, out);
  if (autograd::needs_grad({x})) {
    autograd::record("gelu", {x}, {out}, [x, tanh_approximation](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::empty(g[0].shape());
      activation_kernels().on(x, g[0]).gelu_backward(x, g[0], tanh_approximation, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor swiglu(const Tensor& a, const Tensor& b) {
  check_f32(a, "swiglu", "gate input a");
  check_f32(b, "swiglu", "up input b");
  TP_CHECK(a.shape() == b.shape(), "swiglu: gate shape {} and up shape {} differ", shape_str(a.shape()),
           shape_str(b.shape()));
  Tensor out = Tensor::empty(a.shape());
  activation_kernels().on(a, b).swiglu(a, b, out);
  if (autograd::needs_grad({a, b})) {
    autograd::record("swiglu", {a, b}, {out}, [a, b](const std::vector<Tensor>& g) {
      Tensor da = a.requires_grad() ? Tensor::empty(a.shape()) : Tensor();
      Tensor db = b.requires_grad() ? Tensor::empty(b.shape()) : Tensor();
      activation_kernels().on(a, b, g[0]).swiglu_backward(a, b, g[0], da, db);
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

Tensor softcap(const Tensor& x, double cap) {
  check_f32(x, "softcap", "input");
  TP_CHECK(cap > 0 && std::isfinite(cap), "softcap: the cap must be a positive finite number, got {}", cap);
  const auto c = static_cast<float>(cap);
  Tensor out = Tensor::empty(x.shape());
  activation_kernels().on(x).softcap(x, c, out);
  if (autograd::needs_grad({x})) {
    autograd::record("softcap", {x}, {out}, [out, c](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::empty(g[0].shape());
      activation_kernels().on(out, g[0]).softcap_backward(out, g[0], c, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  check_f32(x, "softmax", "input");
  TP_CHECK(x.dim() >= 1, "softmax: input must have at least one dimension, got shape {}", shape_str(x.shape()));
  const int64_t d = normalize_dim(dim, x.dim());
  Tensor out = Tensor::empty(x.shape());
  activation_kernels().on(x).softmax(x, d, out);
  if (autograd::needs_grad({x})) {
    autograd::record("softmax", {x}, {out}, [out, d](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::empty(out.shape());
      activation_kernels().on(out, g[0]).softmax_backward(out, g[0], d, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

}  // namespace tp::ops
