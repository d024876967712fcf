#include "tp/ops/detail/bf16_gemv.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "tp/ops/detail/bf16_pairs.h"
#include "tp/tensor/convert.h"

namespace tp::ops::detail {

namespace {

// One 64-column panel: four accumulators of 16 lanes, one VDPBF16PS per pair of rows
// each, a chain from zero per chunk, the chunks' sums added in order. Aligned to a
// cache line: decode spends most of its time in this loop, and where the linker
// happened to place it (16-byte aligned) it ran ~8% slower on Zen 5.
__attribute__((target("avx512f,avx512bw,avx512bf16"), aligned(64))) void panel_gemv(const uint32_t* x_pairs, const bf16* panel,
                                                                       int64_t k, int64_t chunk, float* out) {
  // A pair of rows is 64 dwords (the even row's element low, the odd row's high), as 4 vectors.
  const __m512i* w = reinterpret_cast<const __m512i*>(panel);
  __m512 total[4];
  for (int64_t c0 = 0; c0 < k; c0 += chunk) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    const int64_t p1 = std::min(k, c0 + chunk) / 2;
    for (int64_t p = c0 / 2; p < p1; ++p) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x_pairs[p]));
      const __m512i* row = w + 4 * p;
      _mm_prefetch(reinterpret_cast<const char*>(row + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + 66), _MM_HINT_T0);
      for (int j = 0; j < 4; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_load_si512(row + j), xv);
    }
    for (int j = 0; j < 4; ++j) total[j] = c0 == 0 ? acc[j] : _mm512_add_ps(total[j], acc[j]);
  }
  for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + 16 * j, total[j]);
}

}  // namespace

bool bf16_gemv_available() { return cpu_has_avx512_bf16(); }

void bf16_panel_gemv(const bf16* x, const bf16* packed, const dnnl::memory::desc& md, int64_t chunk, const float* bias,
                     float* y) {
  const int64_t k = md.data.dims[0], n = md.data.dims[1];
  const int64_t panel_stride = md.data.format_desc.blocking.strides[1];
  const int64_t panels = (n + kPanelColumns - 1) / kPanelColumns;
  const uint32_t* x_pairs = reinterpret_cast<const uint32_t*>(x);
#pragma omp parallel for schedule(static) if (panels > 1 && k * n > (1 << 18))
  for (int64_t p = 0; p < panels; ++p) {
    alignas(64) float out[kPanelColumns];
    panel_gemv(x_pairs, packed + p * panel_stride, k, chunk, out);
    const int64_t n0 = p * kPanelColumns, cols = std::min(kPanelColumns, n - n0);
    for (int64_t j = 0; j < cols; ++j) y[n0 + j] = bias ? out[j] + bias[n0 + j] : out[j];
  }
}

}  // namespace tp::ops::detail
