#include "tp/ops/vec.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "tp/tensor/convert.h"

// GCC 12's AVX-512 headers initialize their "undefined" vectors with themselves
// (__m512 __Y = __Y), which -W(maybe-)uninitialized reports inside every reduce/extract.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tp::ops::detail {

namespace {

inline float hsum256(__m256 acc) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx512f"))) void axpy_avx512(float alpha, const float* x, float* y, int64_t n) {
  __m512 a = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// e^x, |relative error| < 2e-7: x = n ln2 + r with |r| <= ln2 / 2, e^r by a
// degree-6 polynomial (Cephes' expf coefficients), times 2^n by scalef.
__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.37f)), _mm512_set1_ps(-88.37f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 in two parts: n * hi is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f"))) inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max<int64_t>(left, 0)) - 1);
}

__attribute__((target("avx512f"))) void softmax_avx512(float* p, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16)
    mx = _mm512_mask_max_ps(mx, tail_mask(n - i), mx, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), p + i), s));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 total = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    __m512 e = exp_avx512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, p + i), s, m));
    _mm512_mask_storeu_ps(p + i, k, e);
    total = _mm512_mask_add_ps(total, k, total, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total));
  for (int64_t i = 0; i < n; i += 16)
    _mm512_mask_storeu_ps(p + i, tail_mask(n - i), _mm512_mul_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), p + i), inv));
}

__attribute__((target("avx512f"))) void swiglu_avx512(const float* a, const float* b, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 u = _mm512_maskz_loadu_ps(k, a + i);
    __m512 silu = _mm512_div_ps(u, _mm512_add_ps(one, exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), u))));
    // Below -88, e^-u passes f32's range (exp_avx512 clamps it) and silu(u) < 1e-36.
    silu = _mm512_mask_mov_ps(silu, _mm512_cmp_ps_mask(u, _mm512_set1_ps(-88.f), _CMP_LT_OQ), _mm512_setzero_ps());
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(k, b + i)));
  }
}

__attribute__((target("avx512f"))) void swiglu_backward_avx512(const float* a, const float* b, const float* g,
                                                                float* da, float* db, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 u = _mm512_maskz_loadu_ps(k, a + i), gv = _mm512_maskz_loadu_ps(k, g + i);
    // Below -88, e^-u passes f32's range (exp_avx512 clamps it): s, silu and its slope are 0.
    const __mmask16 tiny = _mm512_cmp_ps_mask(u, _mm512_set1_ps(-88.f), _CMP_LT_OQ);
    __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), u))));
    s = _mm512_mask_mov_ps(s, tiny, _mm512_setzero_ps());
    if (db) _mm512_mask_storeu_ps(db + i, k, _mm512_mul_ps(gv, _mm512_mul_ps(u, s)));
    if (da) {
      const __m512 slope = _mm512_add_ps(s, _mm512_mul_ps(_mm512_mul_ps(u, s), _mm512_sub_ps(one, s)));
      _mm512_mask_storeu_ps(da + i, k, _mm512_mul_ps(_mm512_mul_ps(gv, slope), _mm512_maskz_loadu_ps(k, b + i)));
    }
  }
}

__attribute__((target("avx512f"))) float max_avx512(const float* x, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) mx = _mm512_mask_max_ps(mx, tail_mask(n - i), mx, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  return _mm512_reduce_max_ps(mx);
}

// std::max_element's rule without its NaN quirk: a later element replaces the best only when strictly larger, and
// a NaN never does (nor starts the scan).
int64_t argmax_scalar(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(x[i]) && (best < 0 || x[best] < x[i])) best = i;
  return best;
}

// Each lane keeps its largest number and where it first came (an ordered compare: a NaN is never larger); the answer
// is the first of the lanes that hold the overall maximum. A maximum of -inf (no lane moved) and indices past int32
// take the scalar scan.
__attribute__((target("avx512f"))) int64_t argmax_avx512(const float* x, int64_t n) {
  if (n > INT32_MAX) return argmax_scalar(x, n);
  __m512 best = _mm512_set1_ps(-INFINITY);
  __m512i where = _mm512_set1_epi32(-1);
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i sixteen = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    const __mmask16 larger = _mm512_mask_cmp_ps_mask(k, v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, larger, v);
    where = _mm512_mask_mov_epi32(where, larger, index);
    index = _mm512_add_epi32(index, sixteen);
  }
  const float top = _mm512_reduce_max_ps(best);
  if (top == -INFINITY) return argmax_scalar(x, n);
  return _mm512_mask_reduce_min_epi32(_mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ), where);
}

__attribute__((target("avx512f"))) float exp_sum_avx512(const float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 total = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    total = _mm512_mask_add_ps(total, k, total, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s)));
  }
  return _mm512_reduce_add_ps(total);
}

__attribute__((target("avx512f"))) void exp_scale_avx512(const float* x, int64_t n, float shift, float scale, float* out) {
  const __m512 s = _mm512_set1_ps(shift), c = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(c, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s))));
  }
}

// 16 elements of a row as f32: f32 as is, bf16 widened (its bits are f32's top half).
__attribute__((target("avx512f"))) inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(const bf16* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) float dot_row(const float* q, const T* k, int64_t d) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= d; c += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), load16(k + c, 0xFFFF), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + c + 16), load16(k + c + 16, 0xFFFF), acc1);
  }
  for (; c < d; c += 16) {
    __mmask16 m = tail_mask(d - c);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + c), load16(k + c, m), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// The sums of 8 vectors' lanes, sums[i] = sum of v[i]'s 16 lanes, in 24
// instructions instead of 8 reductions of ~9: pairs of vectors are folded into
// one vector (half the lanes each) until each 128-bit quarter holds two sums.
// (The vectors come by value: an array argument kept GCC storing the
// accumulators to the stack on every step of the loop that sums them.)
__attribute__((target("avx512f"))) inline __m512 fold_pair(__m512 a, __m512 b) {
  // a's lanes folded to 8 (quarters 0-1), b's (quarters 2-3)
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
__attribute__((target("avx512f"))) inline __m512 fold_quads(__m512 a, __m512 b) {
  // from two fold_pair results: quarter q holds the q-th vector's lanes folded to 4
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}
__attribute__((target("avx512f"))) inline __m256 sums_of_8(__m512 v0, __m512 v1, __m512 v2, __m512 v3, __m512 v4,
                                                           __m512 v5, __m512 v6, __m512 v7) {
  const __m512 x0 = fold_quads(fold_pair(v0, v1), fold_pair(v2, v3));
  const __m512 x1 = fold_quads(fold_pair(v4, v5), fold_pair(v6, v7));
  // Quarter q: [x0 folded to 2, x1 folded to 2], then to 1: lane 4q is vector q's sum, lane 4q + 1 vector q + 4's.
  __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(x0, x1), _mm512_unpackhi_ps(x0, x1));
  y = _mm512_add_ps(y, _mm512_permute_ps(y, 0x4E));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, y));
}

// out[r * out_stride + j] for R rows of q and keys j < nk <= 8. Each key's 16
// elements are loaded (and widened) once for the R rows; each (row, key) sums in
// a vector of its own, so no FMA waits on another and the 8 keys' vectors are
// reduced together at the end.
template <typename T, int R>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dots_8_keys(const float* q, const T* k, int64_t key_stride,
                                                                      int64_t nk, int64_t d, float* out,
                                                                      int64_t out_stride) {
  const T* key[8];
  for (int64_t j = 0; j < 8; ++j) key[j] = k + std::min(j, nk - 1) * key_stride;  // past nk: a key again, not stored
  __m512 acc[R][8];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 16) {
    const __mmask16 m = tail_mask(d - c);
    __m512 qv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) qv[r] = _mm512_maskz_loadu_ps(m, q + r * d + c);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512 kv = load16(key[j] + c, m);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(qv[r], kv, acc[r][j]);
    }
  }
  const __mmask8 stored = static_cast<__mmask8>((1u << nk) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    _mm256_mask_storeu_ps(
        out + r * out_stride, stored,
        sums_of_8(acc[r][0], acc[r][1], acc[r][2], acc[r][3], acc[r][4], acc[r][5], acc[r][6], acc[r][7]));
}

// Blocks of 8 keys, and for each block the rows two at a time: the block's keys
// stay in L1 while every row reads them.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dots_avx512(const float* q, int64_t rows, const T* k,
                                                                      int64_t key_stride, int64_t n, int64_t d,
                                                                      float* out, int64_t out_stride) {
  for (int64_t j = 0; j < n; j += 8) {
    const int64_t nk = std::min<int64_t>(8, n - j);
    const T* kj = k + j * key_stride;
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2)
      dots_8_keys<T, 2>(q + r * d, kj, key_stride, nk, d, out + r * out_stride + j, out_stride);
    if (r < rows) dots_8_keys<T, 1>(q + r * d, kj, key_stride, nk, d, out + r * out_stride + j, out_stride);
  }
}

// o's columns [c, c + 16 S) of R rows, in registers while n keys are added: each
// value's 16 elements are loaded (and widened) once for the R rows.
template <typename T, int R, int S>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void axpys_columns(const float* p, int64_t p_stride, const T* v,
                                                                        int64_t key_stride, int64_t n, int64_t d,
                                                                        int64_t c, float* o) {
  __mmask16 m[S];
  __m512 acc[R][S];
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s) {
    m[s] = tail_mask(d - c - 16 * s);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][s] = _mm512_maskz_loadu_ps(m[s], o + r * d + c + 16 * s);
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* vj = v + j * key_stride + c;
    __m512 w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) w[r] = _mm512_set1_ps(p[r * p_stride + j]);
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
      const __m512 x = load16(vj + 16 * s, m[s]);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][s] = _mm512_fmadd_ps(w[r], x, acc[r][s]);
    }
  }
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(o + r * d + c + 16 * s, m[s], acc[r][s]);
}

// axpys_columns<T, R, S> for S = 1..8, by S - 1: the column vectors a row of o has left.
template <typename T, int R, size_t... S>
constexpr auto axpys_columns_by_width(std::index_sequence<S...>) {
  return std::array{&axpys_columns<T, R, static_cast<int>(S) + 1>...};
}
template <typename T, int R>
constexpr auto kAxpysColumns = axpys_columns_by_width<T, R>(std::make_index_sequence<8>{});

// Blocks of 32 keys (in L1 while every row pair reads them), and for each block
// o's columns 128 at a time (16 vectors for a row pair), the rows two at a time.
constexpr int64_t kAxpysKeys = 32;

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void axpys_avx512(const float* p, int64_t p_stride,
                                                                       int64_t rows, const T* v, int64_t key_stride,
                                                                       int64_t n, int64_t d, float* o) {
  for (int64_t j = 0; j < n; j += kAxpysKeys) {
    const int64_t nb = std::min(kAxpysKeys, n - j);
    for (int64_t c = 0; c < d; c += 128) {
      const int s = static_cast<int>(std::min<int64_t>(8, (d - c + 15) / 16));
      int64_t r = 0;
      for (; r + 2 <= rows; r += 2)
        kAxpysColumns<T, 2>[s - 1](p + r * p_stride + j, p_stride, v + j * key_stride, key_stride, nb, d, c, o + r * d);
      if (r < rows)
        kAxpysColumns<T, 1>[s - 1](p + r * p_stride + j, p_stride, v + j * key_stride, key_stride, nb, d, c, o + r * d);
    }
  }
}

float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  float total = hsum256(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

void axpy_avx2(float alpha, const float* x, float* y, int64_t n) {
  __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void softmax_scalar(float* p, int64_t n, float scale) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j] * scale);
  float total = 0;
  for (int64_t j = 0; j < n; ++j) total += (p[j] = std::exp(p[j] * scale - mx));
  float inv = 1.f / total;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
}

void swiglu_scalar(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] / (1.f + std::exp(-a[i])) * b[i];
}

void swiglu_backward_scalar(const float* a, const float* b, const float* g, float* da, float* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.f / (1.f + std::exp(-a[i]));
    if (db) db[i] = g[i] * (a[i] * s);
    if (da) da[i] = g[i] * (s + a[i] * s * (1.f - s)) * b[i];
  }
}

float max_scalar(const float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  return mx;
}

float exp_sum_scalar(const float* x, int64_t n, float shift) {
  float total = 0;
  for (int64_t i = 0; i < n; ++i) total += std::exp(x[i] - shift);
  return total;
}

void exp_scale_scalar(const float* x, int64_t n, float shift, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = scale * std::exp(x[i] - shift);
}

void dots_avx2(const float* q, int64_t rows, const float* k, int64_t key_stride, int64_t n, int64_t d, float* out,
               int64_t out_stride) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < rows; ++r) out[r * out_stride + j] = dot_avx2(q + r * d, k + j * key_stride, d);
}

void axpys_avx2(const float* p, int64_t p_stride, int64_t rows, const float* v, int64_t key_stride, int64_t n,
                int64_t d, float* o) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < rows; ++r) axpy_avx2(p[r * p_stride + j], v + j * key_stride, o + r * d, d);
}

// bf16 rows widened one at a time into this thread's row buffer, then the f32
// kernels. The buffer is kept: the kernels run per block of keys per kv head.
float* widened_row(const bf16* src, int64_t d) {
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(d)) row.resize(static_cast<size_t>(d));
  convert_bf16_to_f32(src, row.data(), static_cast<size_t>(d));
  return row.data();
}

void dots_bf16_avx2(const float* q, int64_t rows, const bf16* k, int64_t key_stride, int64_t n, int64_t d, float* out,
                    int64_t out_stride) {
  for (int64_t j = 0; j < n; ++j) dots_avx2(q, rows, widened_row(k + j * key_stride, d), 0, 1, d, out + j, out_stride);
}

void axpys_bf16_avx2(const float* p, int64_t p_stride, int64_t rows, const bf16* v, int64_t key_stride, int64_t n,
                     int64_t d, float* o) {
  for (int64_t j = 0; j < n; ++j) axpys_avx2(p + j, p_stride, rows, widened_row(v + j * key_stride, d), 0, 1, d, o);
}

}  // namespace

VecKernels vec_kernels_avx2() {
  return {dot_avx2,        axpy_avx2,     softmax_scalar,         dots_avx2,  axpys_avx2,     dots_bf16_avx2,
          axpys_bf16_avx2, swiglu_scalar, swiglu_backward_scalar, max_scalar, exp_sum_scalar, exp_scale_scalar,
          argmax_scalar,   "avx2"};
}

const VecKernels& vec_kernels() {
  static const VecKernels k =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
          ? VecKernels{dot_row<float>,         axpy_avx512,       softmax_avx512,     dots_avx512<float>,
                       axpys_avx512<float>,    dots_avx512<bf16>, axpys_avx512<bf16>, swiglu_avx512,
                       swiglu_backward_avx512, max_avx512,        exp_sum_avx512,     exp_scale_avx512,
                       argmax_avx512,          "avx512"}
          : vec_kernels_avx2();
  return k;
}

}  // namespace tp::ops::detail
