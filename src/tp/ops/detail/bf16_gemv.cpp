#include "tp/ops/detail/bf16_gemv.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tp/core/parallel_for.h"
#include "tp/ops/detail/bf16_pairs.h"
#include "tp/tensor/convert.h"

namespace tp::ops::detail {

namespace {

// One 64-column panel: four accumulators of 16 lanes, one VDPBF16PS per pair of rows
// each, a chain from zero per chunk, the chunks' sums added in order. Aligned to a
// cache line: decode spends most of its time in this loop, and where the linker
// happened to place it (16-byte aligned) it ran ~8% slower on Zen 5.
template <bool kPrefetch>
__attribute__((target("avx512f,avx512bw,avx512bf16"), aligned(64))) void panel_gemv(const uint32_t* x_pairs,
                                                                                    const bf16* panel, int64_t k,
                                                                                    int64_t chunk, float* out) {
  // A pair of rows is 64 dwords (the even row's element low, the odd row's high), as 4 vectors.
  const __m512i* w = reinterpret_cast<const __m512i*>(panel);
  __m512 total[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t c0 = 0; c0 < k; c0 += chunk) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    const int64_t p1 = std::min(k, c0 + chunk) / 2;
    for (int64_t p = c0 / 2; p < p1; ++p) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x_pairs[p]));
      const __m512i* row = w + 4 * p;
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(row + 64), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(row + 66), _MM_HINT_T0);
      }
      for (int j = 0; j < 4; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_load_si512(row + j), xv);
    }
    for (int j = 0; j < 4; ++j) total[j] = c0 == 0 ? acc[j] : _mm512_add_ps(total[j], acc[j]);
  }
  for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + 16 * j, total[j]);
}

// Several rows against one panel: the rows go in blocks of at most 6 (4 accumulators
// a row: 24 of the 32 vector registers, beside the panel's 4 vectors and x's
// broadcast), evenly sized, over sub-blocks of the panel. Every accumulator gets the
// same VDPBF16PS steps, in the same order, as panel_gemv's for its row, so a row's
// bits are the one-row kernel's whatever rows run beside it.
//
// With one block the panel streams as in panel_gemv. With more, only the first block
// to touch a sub-block reads it from memory and the others from L1, so on their own
// the memory would sit idle while they compute: every block prefetches its share of
// the sub-block two ahead into L2, which keeps the stream going (8 rows of a
// 4096 x 4096 weight: 1.3 ms, against 2.0-2.2 without and oneDNN's 2.5; the
// arithmetic alone takes 1.2).
constexpr int64_t kSubBlockPairs = 32;  // 8 KiB of the panel
constexpr int64_t kAheadPairs = 2 * kSubBlockPairs;

template <int R, int kPrefetch>  // kPrefetch: 0 none, 1 panel_gemv's, 2 a share of the sub-block ahead
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline)) inline void rows_block(
    const uint32_t* x_pairs, int64_t x_stride, const __m512i* w, int64_t p0, int64_t p1, __m512* acc, int share,
    int shares) {
  __m512 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = acc[4 * r + j];
  for (int64_t p = p0; p < p1; ++p) {
    const __m512i* row = w + 4 * p;
    if constexpr (kPrefetch == 1) {
      _mm_prefetch(reinterpret_cast<const char*>(row + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + 66), _MM_HINT_T0);
    } else if constexpr (kPrefetch == 2) {
      for (int j = share; j < 4; j += shares)
        _mm_prefetch(reinterpret_cast<const char*>(row + 4 * kAheadPairs + j), _MM_HINT_T1);
    }
    __m512bh wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = (__m512bh)_mm512_load_si512(row + j);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x_pairs[r * x_stride + p]));
      for (int j = 0; j < 4; ++j) a[r][j] = _mm512_dpbf16_ps(a[r][j], wv[j], xv);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[4 * r + j] = a[r][j];
}

template <int R, bool kPrefetch>
__attribute__((target("avx512f,avx512bw,avx512bf16"), aligned(64))) void panel_rows_fixed(
    const uint32_t* x_pairs, int64_t x_stride, const bf16* panel, int64_t k, int64_t chunk, float* out) {
  constexpr int kBlocks = (R + 5) / 6;
  constexpr int kRows = R / kBlocks, kLastRows = R - kRows * (kBlocks - 1);  // R = 8: 4 + 4; 16: 5 + 5 + 6
  const __m512i* w = reinterpret_cast<const __m512i*>(panel);
  alignas(64) __m512 acc[R * 4], total[R * 4] = {};
  for (int64_t c0 = 0; c0 < k; c0 += chunk) {
    for (int i = 0; i < 4 * R; ++i) acc[i] = _mm512_setzero_ps();
    const int64_t pend = std::min(k, c0 + chunk) / 2;
    for (int64_t q0 = c0 / 2; q0 < pend; q0 += kSubBlockPairs) {
      const int64_t q1 = std::min(pend, q0 + kSubBlockPairs);
      if constexpr (kBlocks == 1) {
        rows_block<R, kPrefetch ? 1 : 0>(x_pairs, x_stride, w, q0, q1, acc, 0, 1);
      } else {
        for (int b = 0; b < kBlocks - 1; ++b)
          rows_block<kRows, 2>(x_pairs + b * kRows * x_stride, x_stride, w, q0, q1, acc + 4 * b * kRows, b, kBlocks);
        const int b = kBlocks - 1;
        rows_block<kLastRows, 2>(x_pairs + b * kRows * x_stride, x_stride, w, q0, q1, acc + 4 * b * kRows, b,
                                 kBlocks);
      }
    }
    for (int i = 0; i < 4 * R; ++i) total[i] = c0 == 0 ? acc[i] : _mm512_add_ps(total[i], acc[i]);
  }
  for (int i = 0; i < 4 * R; ++i) _mm512_storeu_ps(out + 16 * i, total[i]);
}

// m rows (2 ... kBf16GemvMaxRows) against one panel: out [m][64].
template <bool kPrefetch>
void panel_rows(const uint32_t* x_pairs, int64_t x_stride, int64_t m, const bf16* panel, int64_t k, int64_t chunk,
                float* out) {
  static constexpr void (*kByRows[])(const uint32_t*, int64_t, const bf16*, int64_t, int64_t, float*) = {
      nullptr,
      panel_rows_fixed<1, kPrefetch>,
      panel_rows_fixed<2, kPrefetch>,
      panel_rows_fixed<3, kPrefetch>,
      panel_rows_fixed<4, kPrefetch>,
      panel_rows_fixed<5, kPrefetch>,
      panel_rows_fixed<6, kPrefetch>,
      panel_rows_fixed<7, kPrefetch>,
      panel_rows_fixed<8, kPrefetch>,
      panel_rows_fixed<9, kPrefetch>,
      panel_rows_fixed<10, kPrefetch>,
      panel_rows_fixed<11, kPrefetch>,
      panel_rows_fixed<12, kPrefetch>,
      panel_rows_fixed<13, kPrefetch>,
      panel_rows_fixed<14, kPrefetch>,
      panel_rows_fixed<15, kPrefetch>,
      panel_rows_fixed<16, kPrefetch>};
  static_assert(sizeof(kByRows) / sizeof(kByRows[0]) == kBf16GemvMaxRows + 1);
  kByRows[m](x_pairs, x_stride, panel, k, chunk, out);
}

// Whether one row (and one block of rows) prefetches 4 KiB ahead of its stream. On the
// Xeon the kernel was written on, one row read at 86-100% of a plain read pass with the
// prefetch; on an AMD EPYC (Zen) the same prefetch cost a quarter of the rate, and
// without it the stream reached the read pass (the hardware prefetcher alone keeps
// up). Both give the same bits, so a process times both on its first one-row products
// over weights larger than L2 (alternating, kTrialCalls each) and keeps the faster;
// TP_BF16_GEMV_PREFETCH=0 or 1 decides instead.
class PrefetchChoice {
 public:
  static constexpr int64_t kTrialMinBytes = int64_t{4} << 20;
  static constexpr int kTrialCalls = 8;

  // -1 while trying; else whether to prefetch.
  int decided() const { return choice_.load(std::memory_order_acquire); }

  // The variant the next trial call runs.
  bool next() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_[1] < calls_[0];
  }

  void record(bool prefetch, double seconds, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (choice_.load(std::memory_order_relaxed) >= 0) return;
    seconds_[prefetch] += seconds;
    bytes_[prefetch] += static_cast<double>(bytes);
    if (++calls_[prefetch] >= kTrialCalls && calls_[!prefetch] >= kTrialCalls)
      choice_.store(seconds_[1] / bytes_[1] < seconds_[0] / bytes_[0] ? 1 : 0, std::memory_order_release);
  }

  static PrefetchChoice& instance() {
    static PrefetchChoice choice;
    return choice;
  }

 private:
  PrefetchChoice() {
    const char* env = std::getenv("TP_BF16_GEMV_PREFETCH");
    if (env != nullptr && (std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0)) choice_ = env[0] - '0';
  }
  std::atomic<int> choice_{-1};
  std::mutex mutex_;
  int calls_[2] = {0, 0};
  double seconds_[2] = {0, 0}, bytes_[2] = {0, 0};
};

template <bool kPrefetch>
void run_panels(const bf16* x, int64_t m, const bf16* packed, int64_t k, int64_t n, int64_t panel_stride,
                int64_t chunk, const float* bias, float* y) {
  const int64_t panels = (n + kPanelColumns - 1) / kPanelColumns;
  const uint32_t* x_pairs = reinterpret_cast<const uint32_t*>(x);
  parallel_for(panels, panels > 1 && k * n > (1 << 18), [&](int64_t p) {
    alignas(64) float out[kBf16GemvMaxRows * kPanelColumns];
    if (m == 1)
      panel_gemv<kPrefetch>(x_pairs, packed + p * panel_stride, k, chunk, out);
    else
      panel_rows<kPrefetch>(x_pairs, k / 2, m, packed + p * panel_stride, k, chunk, out);
    const int64_t n0 = p * kPanelColumns, cols = std::min(kPanelColumns, n - n0);
    for (int64_t i = 0; i < m; ++i) {
      const float* o = out + i * kPanelColumns;
      float* yi = y + i * n + n0;
      for (int64_t j = 0; j < cols; ++j) yi[j] = bias ? o[j] + bias[n0 + j] : o[j];
    }
  });
}

}  // namespace

bool bf16_gemv_available() { return cpu_has_avx512_bf16(); }

int bf16_gemv_prefetch_choice() { return PrefetchChoice::instance().decided(); }

void bf16_panel_gemv(const bf16* x, int64_t m, const bf16* packed, const dnnl::memory::desc& md, int64_t chunk,
                     const float* bias, float* y) {
  const int64_t k = md.data.dims[0], n = md.data.dims[1];
  const int64_t panel_stride = md.data.format_desc.blocking.strides[1];
  PrefetchChoice& choice = PrefetchChoice::instance();
  const int decided = choice.decided();
  if (decided >= 0 || m > 1 || k * n * 2 < PrefetchChoice::kTrialMinBytes) {
    if (decided == 1)
      run_panels<true>(x, m, packed, k, n, panel_stride, chunk, bias, y);
    else
      run_panels<false>(x, m, packed, k, n, panel_stride, chunk, bias, y);
    return;
  }
  const bool prefetch = choice.next();
  const auto t0 = std::chrono::steady_clock::now();
  if (prefetch)
    run_panels<true>(x, m, packed, k, n, panel_stride, chunk, bias, y);
  else
    run_panels<false>(x, m, packed, k, n, panel_stride, chunk, bias, y);
  choice.record(prefetch, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), k * n * 2);
}

}  // namespace tp::ops::detail
