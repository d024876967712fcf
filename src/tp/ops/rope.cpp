#include "tp/ops/rope.h"

#include <algorithm>
#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/rope_kernels.h"
#include "tp/ops/util.h"

namespace tp::ops {

// rope_inv_freq and rope_yarn are host code on purpose: they fill a small table
// once per model, which the rotation kernels (detail/rope_kernels.h) then read.

std::vector<float> rope_inv_freq(int64_t rotary_dim, double theta, const RopeScaling& scaling) {
  TP_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rope: rotary dim must be a positive even number, got {}",
           rotary_dim);
  TP_CHECK(theta > 0, "rope: rope_theta must be positive, got {}", theta);
  std::vector<float> inv(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in f32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  if (scaling.rope_type == "default") return inv;
  TP_CHECK(scaling.rope_type == "llama3", "rope: unsupported rope_type '{}' (supported: default, llama3)",
           scaling.rope_type);
  TP_CHECK(scaling.factor > 0 && scaling.high_freq_factor != scaling.low_freq_factor &&
               scaling.original_max_position_embeddings > 0,
           "rope: invalid llama3 rope_scaling (factor {}, low_freq_factor {}, high_freq_factor {}, "
           "original_max_position_embeddings {})",
           scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
           scaling.original_max_position_embeddings);
  // Python floats (doubles) for the wavelength bounds, f32 tensors for the rest, as in Transformers.
  double old_len = static_cast<double>(scaling.original_max_position_embeddings);
  double low_wavelen = old_len / scaling.low_freq_factor;
  double high_wavelen = old_len / scaling.high_freq_factor;
  float factor = static_cast<float>(scaling.factor);
  for (float& f : inv) {
    float wavelen = static_cast<float>(2 * M_PI) / f;
    float scaled = wavelen > low_wavelen ? f / factor : f;
    bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (medium) {
      float smooth = (static_cast<float>(old_len) / wavelen - static_cast<float>(scaling.low_freq_factor)) /
                     static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
      scaled = (1.f - smooth) * scaled / factor + smooth * scaled;
    }
    f = scaled;
  }
  return inv;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

YarnRope rope_yarn(int64_t rotary_dim, double theta, const YarnScaling& y) {
  TP_CHECK(y.factor >= 1 && y.original_max_position_embeddings > 0 && y.beta_fast > y.beta_slow,
           "rope: invalid yarn rope_scaling (factor {}, original_max_position_embeddings {}, beta_fast {}, beta_slow {})",
           y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow);
  YarnRope r;
  if (y.attention_factor > 0)
    r.attention_factor = y.attention_factor;
  else if (y.mscale != 0 && y.mscale_all_dim != 0)
    r.attention_factor = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
  else
    r.attention_factor = yarn_mscale(y.factor);
  // The dimension (of rotary_dim) whose wavelength turns `rotations` times over the original context.
  const double dim = static_cast<double>(rotary_dim), base = theta;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(y.original_max_position_embeddings) / (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  const std::vector<float> extrapolation = rope_inv_freq(rotary_dim, theta);
  r.inv_freq.resize(extrapolation.size());
  for (size_t i = 0; i < extrapolation.size(); ++i) {
    // f32 as torch: ramp = clamp((i - low) / (high - low), 0, 1); extrapolation weight 1 - ramp.
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                                      (static_cast<float>(high) - static_cast<float>(low)), 0.f, 1.f);
    const float keep = 1.f - ramp;
    const float pos_freq = std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
    const float interpolation = 1.0f / (static_cast<float>(y.factor) * pos_freq);
    r.inv_freq[i] = interpolation * (1.f - keep) + extrapolation[i] * keep;
  }
  return r;
}

namespace {

// ---- CPU kernels

// Rotates x [B, T, H, D] into y; sign = +1 forward, -1 for the backward
// (the transpose of a rotation is the rotation by -a; the amplitude is symmetric).
void rotate_cpu(const Tensor& x_t, const Tensor& positions, const std::vector<float>& inv_freq, float sign,
                const RopeOptions& opt, const Tensor& y_t) {
  const int64_t bt = x_t.size(0) * x_t.size(1), h = x_t.size(2), d = x_t.size(3);
  const int64_t* pos = positions.data<int64_t>();
  const float* x = x_t.data<float>();
  float* y = y_t.data<float>();
  int64_t half = static_cast<int64_t>(inv_freq.size());
  // Interleaved: pair i is (2i, 2i + 1); rotate-half: (i, i + R/2).
  const bool interleaved = opt.layout == RopeLayout::Interleaved;
  const int64_t stride = interleaved ? 2 : 1, partner = interleaved ? 1 : half;
  parallel_for(bt, bt * h * d > 65536, [&](int64_t r) {
    std::vector<float> c(half), s(half);
    float p = static_cast<float>(pos[r]);
    for (int64_t i = 0; i < half; ++i) {
      float a = p * inv_freq[i];  // f32 product, as torch's freqs matmul
      c[i] = std::cos(a) * opt.attention_factor;
      s[i] = sign * std::sin(a) * opt.attention_factor;
    }
    for (int64_t hh = 0; hh < h; ++hh) {
      const float* xr = x + (r * h + hh) * d;
      float* yr = y + (r * h + hh) * d;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t i1 = i * stride, i2 = i1 + partner;
        float x1 = xr[i1], x2 = xr[i2];
        yr[i1] = x1 * c[i] - x2 * s[i];
        yr[i2] = x2 * c[i] + x1 * s[i];
      }
      for (int64_t i = 2 * half; i < d; ++i) yr[i] = xr[i];
    }
  });
}

constexpr RopeKernels kCpuRopeKernels{rotate_cpu};

}  // namespace

KernelTable<RopeKernels>& rope_kernels() {
  static KernelTable<RopeKernels> table("apply_rope", &kCpuRopeKernels);
  return table;
}

Tensor apply_rope(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq,
                  const RopeOptions& opt) {
  check_f32(x, "apply_rope", "input");
  TP_CHECK(x.dim() == 4, "apply_rope: input must be [B, T, H, D], got shape {}", shape_str(x.shape()));
  TP_CHECK(positions.defined() && (positions.dtype() == DType::I64 || positions.dtype() == DType::I32),
           "apply_rope: positions must be i64 or i32");
  TP_CHECK(positions.dim() == 2 && positions.size(0) == x.size(0) && positions.size(1) == x.size(1),
           "apply_rope: positions shape {} does not match input shape {} (expected [B, T])",
           shape_str(positions.shape()), shape_str(x.shape()));
  int64_t d = x.size(3);
  TP_CHECK(static_cast<int64_t>(2 * inv_freq.size()) <= d,
           "apply_rope: {} frequencies need a rotary dim of {}, but the head dim is {} (input shape {})",
           inv_freq.size(), 2 * inv_freq.size(), d, shape_str(x.shape()));
  const Tensor pos = positions.to(DType::I64);
  Tensor out = Tensor::empty(x.shape());
  rope_kernels().on(x, pos).rotate(x, pos, inv_freq, 1.f, opt, out);
  if (autograd::needs_grad({x})) {
    autograd::record("apply_rope", {x}, {out}, [pos, inv_freq, opt](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::empty(g[0].shape());
      rope_kernels().on(g[0], pos).rotate(g[0], pos, inv_freq, -1.f, opt, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

}  // namespace tp::ops
