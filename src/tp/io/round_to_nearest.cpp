#include "tp/io/round_to_nearest.h"

#include <algorithm>
#include <cmath>

namespace tp::io {

namespace {

// `s` rounded up to the nearest value of `d`: codes computed with the stored scale stay in range.
float stored_scale(float s, DType d, const std::string& module) {
  float r = s;
  if (d == DType::F16) {
    f16 h = to_f16(s);
    if (to_f32(h) < s) ++h.bits;
    r = to_f32(h);
  } else if (d == DType::BF16) {
    bf16 b = to_bf16(s);
    if (to_f32(b) < s) ++b.bits;
    r = to_f32(b);
  }
  TP_CHECK(std::isfinite(r) && r > 0, "'{}': a group scale of {} does not fit {} (weights this large cannot be "
           "stored in this format)", module, s, dtype_name(d));
  return r;
}

}  // namespace

RoundedWeight round_to_nearest(const RoundToNearest& o, const Tensor& w, const std::vector<int32_t>& grp,
                               int64_t G, const std::string& module) {
  TP_CHECK(w.dim() == 2 && w.dtype() == DType::F32 && static_cast<int64_t>(grp.size()) == w.size(1),
           "round_to_nearest: f32 [N, K] with a group per input feature expected, got {} {} and {} groups",
           dtype_name(w.dtype()), shape_str(w.shape()), grp.size());
  const int64_t N = w.size(0), K = w.size(1);
  RoundedWeight q{Tensor::empty({N, K}, DType::U8), Tensor::empty({N, G}, DType::U8), Tensor::empty({N, G})};
  uint8_t* codes = q.codes.data<uint8_t>();
  uint8_t* zeros = q.zeros.data<uint8_t>();
  float* scales = q.scales.data<float>();
  const int maxq = (1 << o.bits) - 1, mid = 1 << (o.bits - 1);
  const float* src = w.data<float>();
  std::vector<float> lo(G), hi(G);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = src + n * K;
    std::fill(lo.begin(), lo.end(), 0.f);
    std::fill(hi.begin(), hi.end(), 0.f);
    for (int64_t k = 0; k < K; ++k) {
      TP_CHECK(std::isfinite(row[k]), "'{}.weight' holds {} at [{}, {}]; only finite weights can be quantized",
               module, row[k], n, k);
      lo[grp[k]] = std::min(lo[grp[k]], row[k]);
      hi[grp[k]] = std::max(hi[grp[k]], row[k]);
    }
    for (int64_t g = 0; g < G; ++g) {
      float s;
      int z;
      if (o.sym) {
        const float absmax = std::max(-lo[g], hi[g]);
        s = stored_scale(absmax > 0 ? absmax / static_cast<float>(mid - 1) : 1.f, o.scale_dtype, module);
        z = mid;
      } else {
        s = stored_scale(hi[g] > lo[g] ? (hi[g] - lo[g]) / static_cast<float>(maxq) : 1.f, o.scale_dtype, module);
        z = static_cast<int>(std::nearbyint(-lo[g] / s));
        // A stored -1 would be read as 2^bits: a group without negative weights
        // therefore gets z = 1 and the range [0, max] over the codes 1 .. 2^bits - 1.
        if (o.zero_point_minus_one && z == 0) {
          s = stored_scale(hi[g] > 0 ? hi[g] / static_cast<float>(maxq - 1) : 1.f, o.scale_dtype, module);
          z = 1;
        }
        z = std::clamp(z, 0, maxq);
      }
      scales[n * G + g] = s;
      zeros[n * G + g] = static_cast<uint8_t>(z);
    }
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at = n * G + grp[k];
      const float v = std::nearbyint(row[k] / scales[at]) + static_cast<float>(zeros[at]);
      codes[n * K + k] = static_cast<uint8_t>(std::clamp(v, 0.f, static_cast<float>(maxq)));
    }
  }
  return q;
}

}  // namespace tp::io
