#include "tp/ops/ordered_gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tp/core/error.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/dnnl_context.h"
#include "tp/ops/gemm.h"

namespace tp::ops::detail {

namespace {

// Eight W values of row `w` from column p, widened to f32 (a bf16 is the high half of its f32).
template <bool Bf16>
inline __m256 load_w(const char* w, int64_t p) {
  if constexpr (Bf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + p);
  }
}

template <bool Bf16>
inline float w_at(const char* w, int64_t p) {
  if constexpr (Bf16) {
    uint16_t h;
    std::memcpy(&h, w + 2 * p, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  } else {
    return reinterpret_cast<const float*>(w)[p];
  }
}

// MR rows × NR columns of C: MR·NR chains of eight lanes over the whole of K.
template <int MR, int NR, bool Bf16>
void tile(const float* a, int64_t lda, const char* w, int64_t ldw_bytes, int64_t k, const float* bias, float* c,
          int64_t ldc) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t p = 0; p < k8; p += 8) {
    __m256 av[MR];
    for (int i = 0; i < MR; ++i) av[i] = _mm256_loadu_ps(a + i * lda + p);
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = load_w<Bf16>(w + j * ldw_bytes, p);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(av[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = ordered_lane_sum(acc[i][j]);
      for (int64_t p = k8; p < k; ++p) s = std::fma(a[i * lda + p], w_at<Bf16>(w + j * ldw_bytes, p), s);
      c[i * ldc + j] = bias != nullptr ? s + bias[j] : s;
    }
}

using TileFn = void (*)(const float*, int64_t, const char*, int64_t, int64_t, const float*, float*, int64_t);

// Column counts per tile for 1, 2 and 3 rows: 12, 12 and 12 accumulators, with
// room left among the 16 ymm registers for the A rows and one W vector.
constexpr int kMaxRows = 3;
constexpr int kCols[kMaxRows] = {12, 6, 4};

template <int MR, bool Bf16, size_t... J>
constexpr std::array<TileFn, sizeof...(J)> tiles(std::index_sequence<J...>) {
  return {&tile<MR, static_cast<int>(J) + 1, Bf16>...};
}

template <bool Bf16>
TileFn tile_for(int rows, int cols) {
  static constexpr auto one = tiles<1, Bf16>(std::make_index_sequence<kCols[0]>{});
  static constexpr auto two = tiles<2, Bf16>(std::make_index_sequence<kCols[1]>{});
  static constexpr auto three = tiles<3, Bf16>(std::make_index_sequence<kCols[2]>{});
  return rows == 1 ? one[cols - 1] : rows == 2 ? two[cols - 1] : three[cols - 1];
}

// A column block of a bf16 W, widened to f32 once ([cols, k], row stride k):
// exact, so the tiles that read it compute the same sequence as on the bf16.
void widen_block(const char* w, int64_t ldw_bytes, int64_t cols, int64_t k, float* out) {
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t c = 0; c < cols; ++c) {
    const char* row = w + c * ldw_bytes;
    float* dst = out + c * k;
    for (int64_t p = 0; p < k8; p += 8) _mm256_storeu_ps(dst + p, load_w<true>(row, p));
    for (int64_t p = k8; p < k; ++p) dst[p] = w_at<true>(row, p);
  }
}

// Every row group's tiles over columns [j0, j1) of C, reading W's rows from wb
// (row stride wb_ld bytes; bf16 unless `wide`).
void tiles_over_block(int64_t m, int64_t j0, int64_t j1, int64_t k, const float* a, int64_t lda, const char* wb,
                      int64_t wb_ld, bool bf16, const float* bias, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; i += kMaxRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - i));
    for (int64_t j = j0; j < j1; j += kCols[rows - 1]) {
      const int cols = static_cast<int>(std::min<int64_t>(kCols[rows - 1], j1 - j));
      const TileFn tile_fn = bf16 ? tile_for<true>(rows, cols) : tile_for<false>(rows, cols);
      tile_fn(a + i * lda, lda, wb + (j - j0) * wb_ld, wb_ld, k, bias ? bias + j : nullptr, c + i * ldc + j, ldc);
    }
  }
}

// Columns per block: a block's weights (about 256 KiB as read) stay in L2 while
// every row passes over them; 12 columns is a whole number of tiles for each row count.
int64_t block_columns(int64_t k, int64_t read_bytes) {
  return std::max<int64_t>(12, (256 << 10) / std::max<int64_t>(1, k * read_bytes) / 12 * 12);
}

bool threaded_blocks(int64_t blocks, int64_t m, int64_t n, int64_t k) {
  return blocks > 1 && m * n * k >= (int64_t{1} << 18) && !omp_in_parallel();
}

// A per-thread f32 buffer for one column block (allocated once per thread, reused).
float* block_buffer(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(floats)) buffer.resize(static_cast<size_t>(floats));
  return buffer.data();
}

template <bool Bf16>
void run(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const char* w, int64_t ldw, const float* bias,
         float* c, int64_t ldc) {
  const int64_t ldw_bytes = ldw * (Bf16 ? 2 : 4);
  // Past one group of rows, a bf16 block is widened once and every group reads
  // f32 (widening in the inner loop cost ~30% of the rate: 27 against 39 GFLOP/s
  // on an AVX2 EPYC); one group reads the bf16 as it is (decode: no extra pass).
  const bool widen = Bf16 && m > kMaxRows;
  const int64_t block = block_columns(k, Bf16 && !widen ? 2 : 4);
  const int64_t blocks = (n + block - 1) / block;
  parallel_for(blocks, threaded_blocks(blocks, m, n, k), [&](int64_t b) {
    const int64_t j0 = b * block, j1 = std::min(n, j0 + block);
    const char* wb = w + j0 * ldw_bytes;
    int64_t wb_ld = ldw_bytes;
    if (widen) {
      float* widened = block_buffer(block * k);
      widen_block(wb, ldw_bytes, j1 - j0, k, widened);
      wb = reinterpret_cast<const char*>(widened);
      wb_ld = k * 4;
    }
    tiles_over_block(m, j0, j1, k, a, lda, wb, wb_ld, Bf16 && !widen, bias, c, ldc);
  });
}

// TP_GEMM, read once: 1 "ordered", 0 "onednn", -1 unset.
int gemm_env() {
  static const int choice = [] {
    const char* env = std::getenv("TP_GEMM");
    if (env == nullptr || *env == 0) return -1;
    const std::string v(env);
    TP_CHECK(v == "ordered" || v == "onednn", "TP_GEMM='{}' is not one of ordered, onednn", v);
    return v == "ordered" ? 1 : 0;
  }();
  return choice;
}

}  // namespace

bool ordered_gemm_wanted() {
  static const bool wanted = [] {
    if (gemm_env() >= 0) return gemm_env() == 1;
    using dnnl::memory;
    const memory::desc a({16, 1024}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc w({1024, 1024}, memory::data_type::f32, memory::format_tag::any);
    const memory::desc c({16, 1024}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, w, memory::desc(), c), dnnl_engine());
    return std::string(pd.impl_info_str()).rfind("brg", 0) != 0;
  }();
  return wanted;
}

void ordered_gemm(int64_t m, int64_t n, int64_t k, const void* a, DType a_dtype, int64_t lda, const void* w,
                  DType w_dtype, int64_t ldw, const float* bias, float* c, int64_t ldc) {
  TP_CHECK((a_dtype == DType::F32 || a_dtype == DType::BF16) && (w_dtype == DType::F32 || w_dtype == DType::BF16),
           "ordered_gemm: A and W must be f32 or bf16, not {} and {}", dtype_name(a_dtype), dtype_name(w_dtype));
  if (m <= 0 || n <= 0) return;
  const float* af = static_cast<const float*>(a);
  if (k > 0 && (a_dtype == DType::BF16 || w_dtype == DType::BF16)) af = bf16_valued_f32(a, a_dtype, m, k, lda, 0);
  const char* wb = static_cast<const char*>(w);
  if (w_dtype == DType::BF16)
    run<true>(m, n, k, af, lda, wb, ldw, bias, c, ldc);
  else
    run<false>(m, n, k, af, lda, wb, ldw, bias, c, ldc);
}

}  // namespace tp::ops::detail
