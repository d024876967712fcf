#include "tp/ops/quantized_linear.h"

#include <immintrin.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>

#include "tp/ops/ordered_gemm.h"

namespace tp::ops {

// Codes in panels of 8 rows: each chunk of 32 inputs holds the 8 rows' codes of
// those inputs one row after the other, 32 bytes a row for 8-bit codes, 16 for
// 4-bit ones (byte j holds input j in its low nibble and input j + 16 in its high
// one, so a widening load of 8 bytes, a mask and a shift give two vectors of eight
// inputs). A tile of rows then streams one run of memory. The last K % 32 inputs of
// every row follow all panels, one or two a byte in order.
struct QuantizedLinear::State {
  static constexpr int64_t kPanel = 8;
  int bits = 4;
  int64_t n = 0, k = 0, groups = 0;
  int64_t chunks32 = 0;    // whole chunks of 32 inputs: k / 32
  int64_t chunk_bytes = 0;  // one row's codes in one chunk: 16 or 32
  int64_t tail_bytes = 0;   // one row's codes past the chunks
  std::vector<uint8_t> codes;       // panels, then the tails; inputs in run order
  std::vector<uint16_t> scales16;   // [n, groups] as f16 when every scale is one exactly,
  std::vector<float> scales32;      // else as f32
  std::vector<uint8_t> zeros;       // [n, groups]
  std::vector<int64_t> run_start;   // runs of inputs (in run order) that share a group: [runs + 1]
  std::vector<int32_t> run_group;   // each run's group
  std::vector<int32_t> perm;        // act-order: run-order position p holds input perm[p]; empty: identity
  // Per chunk of 32 inputs: the group of all its inputs, or -1 when they are not
  // all in one (a run's edge, the last K % 32): such chunks are read one by one.
  std::vector<int32_t> chunk_group;

  float scale(int64_t row, int64_t group) const {
    const size_t i = static_cast<size_t>(row * groups + group);
    return scales16.empty() ? scales32[i] : _cvtsh_ss(scales16[i]);
  }
  // Row `row`'s codes of chunk ch (< chunks32).
  const uint8_t* chunk(int64_t row, int64_t ch) const {
    return codes.data() + ((row / kPanel * chunks32 + ch) * kPanel + row % kPanel) * chunk_bytes;
  }
  // The codes' layout for `bits` and k (n set): whole chunks of 32 inputs in panels, then each row's tail.
  void lay_out_codes() {
    chunks32 = k / 32;
    chunk_bytes = bits == 8 ? 32 : 16;
    tail_bytes = bits == 8 ? k % 32 : (k % 32 + 1) / 2;
  }
  size_t code_bytes() const { return panel_bytes() + static_cast<size_t>(n * tail_bytes); }
  size_t panel_bytes() const { return static_cast<size_t>((n + kPanel - 1) / kPanel * kPanel * chunks32 * chunk_bytes); }
  // The byte holding input p of a row and the shift of its bits there.
  std::pair<size_t, int> code_at(int64_t row, int64_t p) const {
    const int64_t k32 = chunks32 * 32;
    if (p < k32) {
      const size_t base = static_cast<size_t>(chunk(row, p / 32) - codes.data());
      const int64_t j = p % 32;
      if (bits == 8) return {base + j, 0};
      return {base + j % 16, j < 16 ? 0 : 4};
    }
    const size_t base = panel_bytes() + static_cast<size_t>(row * tail_bytes);
    const int64_t t = p - k32;
    if (bits == 8) return {base + t, 0};
    return {base + t / 2, t % 2 == 0 ? 0 : 4};
  }
  int code(int64_t row, int64_t p) const {
    const auto [byte, shift] = code_at(row, p);
    return (codes[byte] >> shift) & ((1 << bits) - 1);
  }
  void set_code(int64_t row, int64_t p, int value) {
    const auto [byte, shift] = code_at(row, p);
    codes[byte] = static_cast<uint8_t>(codes[byte] | (value << shift));
  }

  int64_t group_at(int64_t p) const {
    return run_group[std::upper_bound(run_start.begin(), run_start.end(), p) - run_start.begin() - 1];
  }
  // W[row, input at run-order position p] as f32.
  float value(int64_t row, int64_t p) const;
  // W's rows [j0, j1) as f32 [j1 - j0, k], inputs in run order.
  void dequantize_rows(int64_t j0, int64_t j1, float* out) const;
};

namespace {

// The four vectors of eight W values of chunk c (inputs 32c ..< 32c + 32 of one
// row, all in one group): scale * (code - zero), in input order.
inline void chunk_values(const uint8_t* codes, int bits, __m256i zero, __m256 scale, __m256 out[4]) {
  __m256i v[4];
  if (bits == 8) {
    for (int i = 0; i < 4; ++i)
      v[i] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * i)));
  } else {
    const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
    const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8)));
    const __m256i mask = _mm256_set1_epi32(15);
    v[0] = _mm256_and_si256(b0, mask);
    v[1] = _mm256_and_si256(b1, mask);
    v[2] = _mm256_srli_epi32(b0, 4);
    v[3] = _mm256_srli_epi32(b1, 4);
  }
  for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(v[i], zero)));
}

void fill_rows(const void* ctx, int64_t j0, int64_t j1, float* rows) {
  static_cast<const QuantizedLinear::State*>(ctx)->dequantize_rows(j0, j1, rows);
}

// x's rows as the decode kernels read them: f32, and (bf16 dot-product kernel) each value split into two bf16
// values whose sum is x within 2^-17 of it.
struct Rows {
  const float* a;
  const uint16_t* hi;
  const uint16_t* lo;
};

// Few rows (decode): MR rows of x against NR rows of W, W's values made in
// registers as they are read, in ordered_gemm's sequence (ordered_gemm.h): eight
// lanes over K by FMA from zero, summed in its lane order, then the last K % 8
// terms in order, then the bias. So the outputs are the bits ordered_gemm gives
// over dequantize_rows' values, and a row's bits do not depend on the others.
template <int MR, int NR>
void fused_tile(const QuantizedLinear::State& s, const Rows& x, int64_t j, const float* bias, float* c) {
  const float* a = x.a;
  const int64_t k = s.k, k8 = k & ~int64_t{7};
  const int64_t chunks = static_cast<int64_t>(s.chunk_group.size());
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int32_t g = s.chunk_group[ch];
    const int64_t p = 32 * ch;
    if (g >= 0) {
      for (int r = 0; r < NR; ++r) {
        const int64_t row = j + r;
        __m256 w[4];
        chunk_values(s.chunk(row, ch), s.bits, _mm256_set1_epi32(s.zeros[row * s.groups + g]),
                     _mm256_set1_ps(s.scale(row, g)), w);
        for (int v = 0; v < 4; ++v)
          for (int i = 0; i < MR; ++i)
            acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i * k + p + 8 * v), w[v], acc[i][r]);
      }
      continue;
    }
    for (int64_t q = p; q < std::min(k8, p + 32); q += 8)  // a chunk across groups: value by value
      for (int r = 0; r < NR; ++r) {
        alignas(32) float w[8];
        for (int t = 0; t < 8; ++t) w[t] = s.value(j + r, q + t);
        for (int i = 0; i < MR; ++i)
          acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i * k + q), _mm256_load_ps(w), acc[i][r]);
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) {
      float sum = detail::ordered_lane_sum(acc[i][r]);
      for (int64_t q = k8; q < k; ++q) sum = std::fma(a[i * k + q], s.value(j + r, q), sum);
      c[i * s.n + j + r] = bias != nullptr ? sum + bias[j + r] : sum;
    }
}

// Rows of W a tile, by rows of x: accumulators and W's four vectors fit in the 16 ymm registers.
constexpr int kFusedRows = 4;
constexpr int kDotRows = 2;  // the AVX512-BF16 kernel's (quantized_decode_kernel)
constexpr int kFusedCols[kFusedRows] = {4, 4, 2, 2};

using FusedTileFn = void (*)(const QuantizedLinear::State&, const Rows&, int64_t, const float*, float*);

// Tile functions by rows of x and columns: Tile<MR, NC>::fn for NC in 1 ..< Cols + 1 (rows without columns:
// none).
template <template <int, int> class Tile, int MR, int Cols>
constexpr std::array<FusedTileFn, 4> tile_row() {
  std::array<FusedTileFn, 4> out{};
  [&]<size_t... C>(std::index_sequence<C...>) { ((out[C] = Tile<MR, static_cast<int>(C) + 1>::fn), ...); }(
      std::make_index_sequence<Cols>{});
  return out;
}

template <template <int, int> class Tile, int C1, int C2, int C3 = 0, int C4 = 0>
FusedTileFn tile_for(int rows, int cols) {
  static constexpr std::array<std::array<FusedTileFn, 4>, 4> table{
      tile_row<Tile, 1, C1>(), tile_row<Tile, 2, C2>(), tile_row<Tile, 3, C3>(), tile_row<Tile, 4, C4>()};
  return table[rows - 1][cols - 1];
}

template <int MR, int NR>
struct FusedTile {
  static constexpr FusedTileFn fn = &fused_tile<MR, NR>;
};

FusedTileFn fused_tile_for(int rows, int cols) {
  return tile_for<FusedTile, kFusedCols[0], kFusedCols[1], kFusedCols[2], kFusedCols[3]>(rows, cols);
}

// The same sequence on AVX-512, two rows of W a register: lanes 0-7 are row a's
// eight lanes, 8-15 row b's, against x's eight values in both halves. 4-bit codes
// become W's values by a lookup in the 16 values scale * (q - zero) of each row's
// current group (the same roundings as the product), 8-bit ones as on AVX2.
#define TP_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

TP_AVX512 inline __m512 halves(float a, float b) {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

// Row pair q's two rows, as a zmm of W values for the eight inputs 8v ..< 8v + 8 of chunk ch.
struct PairState {
  __m512 table_a, table_b;  // 4-bit: the rows' 16 values in the current group
  __m512 scale;             // 8-bit: each half's scale and zero
  __m512i zero;
};

TP_AVX512 inline void pair_group(const QuantizedLinear::State& s, int64_t ra, int32_t g, PairState& ps) {
  const float sa = s.scale(ra, g), sb = s.scale(ra + 1, g);
  const int za = s.zeros[ra * s.groups + g], zb = s.zeros[(ra + 1) * s.groups + g];
  if (s.bits == 4) {
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    ps.table_a = _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(za))));
    ps.table_b = _mm512_mul_ps(_mm512_set1_ps(sb), _mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(zb))));
  } else {
    ps.scale = halves(sa, sb);
    ps.zero = _mm512_inserti32x8(_mm512_set1_epi32(za), _mm256_set1_epi32(zb), 1);
  }
}

TP_AVX512 inline void pair_values(const QuantizedLinear::State& s, int64_t ra, int64_t ch, const PairState& ps,
                                  __m512 w[4]) {
  const uint8_t* row_a = s.chunk(ra, ch);  // ra is even: ra + 1 is in the same panel, right after it
  const uint8_t* row_b = row_a + s.chunk_bytes;
  if (s.bits == 4) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row_a));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row_b));
    const __m512i lo = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(a, b));  // bytes 0-7 of each: inputs 0-7 and 16-23
    const __m512i hi = _mm512_cvtepu8_epi32(_mm_unpackhi_epi64(a, b));  // bytes 8-15: inputs 8-15 and 24-31
    const __m512i mask = _mm512_set1_epi32(15);
    const __m512i upper = _mm512_inserti32x8(_mm512_setzero_si512(), _mm256_set1_epi32(16), 1);  // row b's table
    const __m512i idx[4] = {_mm512_or_si512(_mm512_and_si512(lo, mask), upper),
                            _mm512_or_si512(_mm512_and_si512(hi, mask), upper),
                            _mm512_or_si512(_mm512_srli_epi32(lo, 4), upper),
                            _mm512_or_si512(_mm512_srli_epi32(hi, 4), upper)};
    for (int v = 0; v < 4; ++v) w[v] = _mm512_permutex2var_ps(ps.table_a, idx[v], ps.table_b);
    return;
  }
  for (int v = 0; v < 4; ++v) {
    const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row_a + 8 * v));
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row_b + 8 * v));
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(a, b));
    w[v] = _mm512_mul_ps(ps.scale, _mm512_cvtepi32_ps(_mm512_sub_epi32(codes, ps.zero)));
  }
}

// A chunk (inputs p ..< p + 32, fewer at K's end) whose inputs are not all in one group (a run's edge, the last
// K % 32): W's values one by one, eight inputs at a time by FMA into acc (lanes 0-7 row a's, 8-15 row b's); the
// last K % 8 are store_pair_rows'.
template <int MR, int NP>
TP_AVX512 inline void straddling_chunk(const QuantizedLinear::State& s, const float* a, int64_t j, int64_t p,
                                       __m512 (&acc)[MR][NP]) {
  const int64_t k = s.k, k8 = k & ~int64_t{7};
  for (int64_t e = p; e < std::min(k8, p + 32); e += 8)
    for (int q = 0; q < NP; ++q) {
      alignas(64) float w[16];
      for (int t = 0; t < 8; ++t) {
        w[t] = s.value(j + 2 * q, e + t);
        w[8 + t] = s.value(j + 2 * q + 1, e + t);
      }
      for (int i = 0; i < MR; ++i)
        acc[i][q] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(a + i * k + e)), _mm512_load_ps(w),
                                    acc[i][q]);
    }
}

// Each row's output: its eight lanes summed in ordered_gemm's order, then its last K % 8 terms in order, then
// the bias.
template <int MR, int NP>
TP_AVX512 inline void store_pair_rows(const QuantizedLinear::State& s, const float* a, int64_t j,
                                      const __m512 (&acc)[MR][NP], const float* bias, float* c) {
  const int64_t k = s.k, k8 = k & ~int64_t{7};
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NP; ++q)
      for (int h = 0; h < 2; ++h) {
        const int64_t row = j + 2 * q + h;
        const __m256 lanes = h == 0 ? _mm512_castps512_ps256(acc[i][q]) : _mm512_extractf32x8_ps(acc[i][q], 1);
        float sum = detail::ordered_lane_sum(lanes);
        for (int64_t e = k8; e < k; ++e) sum = std::fma(a[i * k + e], s.value(row, e), sum);
        c[i * s.n + row] = bias != nullptr ? sum + bias[row] : sum;
      }
}

template <int MR, int NP>
TP_AVX512 void fused_pair_tile(const QuantizedLinear::State& s, const Rows& x, int64_t j, const float* bias,
                               float* c) {
  const float* a = x.a;
  const int64_t k = s.k;
  const int64_t chunks = static_cast<int64_t>(s.chunk_group.size());
  __m512 acc[MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_setzero_ps();
  PairState ps[NP];
  int32_t group = -1;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int32_t g = s.chunk_group[ch];
    const int64_t p = 32 * ch;
    if (g >= 0) {
      if (g != group)
        for (int q = 0; q < NP; ++q) pair_group(s, j + 2 * q, g, ps[q]);
      group = g;
      for (int q = 0; q < NP; ++q) {
        __m512 w[4];
        pair_values(s, j + 2 * q, ch, ps[q], w);
        for (int v = 0; v < 4; ++v)
          for (int i = 0; i < MR; ++i)
            acc[i][q] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(a + i * k + p + 8 * v)), w[v], acc[i][q]);
      }
      continue;
    }
    straddling_chunk<MR, NP>(s, a, j, p, acc);
  }
  store_pair_rows<MR, NP>(s, a, j, acc, bias, c);
}

// Row pairs a tile, by rows of x (32 zmm registers: accumulators, two tables a pair).
constexpr int kPairCols[kFusedRows] = {4, 4, 3, 3};

template <int MR, int NP>
struct PairTile {
  static constexpr FusedTileFn fn = &fused_pair_tile<MR, NP>;
};

FusedTileFn pair_tile_for(int rows, int pairs) {
  return tile_for<PairTile, kPairCols[0], kPairCols[1], kPairCols[2], kPairCols[3]>(rows, pairs);
}

bool avx512_available() {
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return available;
}

// Few rows (decode) of 4-bit codes with AVX512-BF16: one VDPBF16PS multiplies 32 weights where an FMA does 16,
// and a code becomes its weight by one VPERMW lookup, so a weight costs fewer instructions than in the exact
// kernels above, which are bound by them (their 4-bit decode ran at ~0.9x bf16's rate). Per group, with W's rows
// a and b of a pair in the two halves of a register:
//   acc += x_hi . (code - zero) + x_lo . (code - zero)   (x = x_hi + x_lo within 2^-17 |x|; code - zero, |.| < 16,
//                                                          is an exact bf16 integer)
//   total += scale * acc                                  (each lane, at the group's end)
// so the product is within about 2^-17 of sum |x w| of the exact one (tested within 2^-16) rather than
// ordered_gemm's bits; a row's output still does not depend on the rows around it. TP_GEMM=ordered keeps the exact
// kernels.
#define TP_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

bool avx512_bf16_available() {
  static const bool available = avx512_available() && __builtin_cpu_supports("avx512bf16");
  return available;
}

// x's rows [m, k] as hi = bf16(x) and lo = bf16(x - hi), round to nearest even.
TP_AVX512_BF16 void split_bf16(const float* a, int64_t count, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 mask = count - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(mask, a + i);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    const __m256i l = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back));
    _mm256_mask_storeu_epi16(hi + i, mask, h);
    _mm256_mask_storeu_epi16(lo + i, mask, l);
  }
}

// A row pair's lookup table for group g (words 0-15 row a's value of each code, 16-31 row b's) and each half's
// scale.
struct DotPair {
  __m512i table;
  __m512 scale;
};

TP_AVX512_BF16 inline void dot_pair_group(const QuantizedLinear::State& s, int64_t ra, int32_t g, DotPair& dp) {
  const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 ta = _mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>(s.zeros[ra * s.groups + g])));
  const __m512 tb = _mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>(s.zeros[(ra + 1) * s.groups + g])));
  dp.table = (__m512i)_mm512_cvtne2ps_pbh(tb, ta);  // words 0-15 from ta
  dp.scale = halves(s.scale(ra, g), s.scale(ra + 1, g));
}

// 32 code bytes (16 of row a, 16 of row b) as two index vectors: the low and the high nibbles, row b's + 16.
TP_AVX512_BF16 inline void nibble_indices(__m256i bytes, __m512i& lo, __m512i& hi) {
  const __m512i w = _mm512_cvtepu8_epi16(bytes);
  const __m512i m15 = _mm512_set1_epi16(15);
  const __m512i upper = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
  lo = _mm512_ternarylogic_epi32(w, m15, upper, 0xEA);  // (w & 15) | upper
  hi = _mm512_or_si512(_mm512_srli_epi16(w, 4), upper);
}

// acc[0] += w . x_hi, acc[1] += w . x_lo.
TP_AVX512_BF16 inline void dot2(__m512& acc_hi, __m512& acc_lo, __m512i w, __m512i xh, __m512i xl) {
  acc_hi = _mm512_dpbf16_ps(acc_hi, (__m512bh)w, (__m512bh)xh);
  acc_lo = _mm512_dpbf16_ps(acc_lo, (__m512bh)w, (__m512bh)xl);
}

// 16 bf16 values of x (inputs p ..< p + 16 of a row) in both halves.
TP_AVX512_BF16 inline __m512i both_halves(const uint16_t* x) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}

// A group's end: its sums (x_hi's and x_lo's, in two accumulators so that the products do not wait on each
// other), times its scales, into the totals.
template <int MR, int NP>
TP_AVX512_BF16 inline void flush_groups(__m512 (&acc)[2][MR][NP], const DotPair (&dp)[NP], __m512 (&total)[MR][NP]) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      total[i][q] = _mm512_fmadd_ps(_mm512_add_ps(acc[0][i][q], acc[1][i][q]), dp[q].scale, total[i][q]);
      acc[0][i][q] = acc[1][i][q] = _mm512_setzero_ps();
    }
}

template <int MR, int NP>
TP_AVX512_BF16 void dot_pair_tile(const QuantizedLinear::State& s, const Rows& x, int64_t j, const float* bias,
                                  float* c) {
  const int64_t k = s.k;
  const int64_t chunks = static_cast<int64_t>(s.chunk_group.size());
  __m512 total[MR][NP], acc[2][MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NP; ++q) total[i][q] = acc[0][i][q] = acc[1][i][q] = _mm512_setzero_ps();
  DotPair dp[NP];
  int32_t group = -1;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int32_t g = s.chunk_group[ch];
    const int64_t p = 32 * ch;
    if (g >= 0) {
      if (g != group) {
        if (group >= 0) flush_groups<MR, NP>(acc, dp, total);
        for (int q = 0; q < NP; ++q) dot_pair_group(s, j + 2 * q, g, dp[q]);
        group = g;
      }
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) {
        // Row a's 16 code bytes then row b's (j is even: they follow in the panel); low nibbles are inputs
        // p ..< p + 16, high ones p + 16 ..< p + 32.
        __m512i lo, hi;
        nibble_indices(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.chunk(j + 2 * q, ch))), lo, hi);
        const __m512i w_lo = _mm512_permutexvar_epi16(lo, dp[q].table);
        const __m512i w_hi = _mm512_permutexvar_epi16(hi, dp[q].table);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const uint16_t* xh = x.hi + i * k + p;
          const uint16_t* xl = x.lo + i * k + p;
          dot2(acc[0][i][q], acc[1][i][q], w_lo, both_halves(xh), both_halves(xl));
          dot2(acc[0][i][q], acc[1][i][q], w_hi, both_halves(xh + 16), both_halves(xl + 16));
        }
      }
      continue;
    }
    straddling_chunk<MR, NP>(s, x.a, j, p, total);  // f32 values into the totals
  }
  if (group >= 0) flush_groups<MR, NP>(acc, dp, total);
  store_pair_rows<MR, NP>(s, x.a, j, total, bias, c);
}

constexpr int kDotPairCols[kDotRows] = {4, 3};

template <int MR, int NP>
struct DotPairTile {
  static constexpr FusedTileFn fn = &dot_pair_tile<MR, NP>;
};

FusedTileFn dot_pair_tile_for(int rows, int pairs) {
  return tile_for<DotPairTile, kDotPairCols[0], kDotPairCols[1]>(rows, pairs);
}

void fused_product(const QuantizedLinear::State& s, int64_t m, const float* a, const float* bias, float* c) {
  const detail::QuantizedKernel kernel = detail::quantized_decode_kernel(s.bits, m);
  Rows x{a, nullptr, nullptr};
  thread_local std::vector<uint16_t> split;
  if (kernel == detail::QuantizedKernel::Avx512Bf16) {
    split.resize(static_cast<size_t>(2 * m * s.k));  // only whole chunks (32 inputs in a row) are read from it
    split_bf16(a, m * s.k, split.data(), split.data() + m * s.k);
    x.hi = split.data();
    x.lo = split.data() + m * s.k;
  }
  // Blocks of W's rows split over the threads; each streams its rows once.
  constexpr int64_t kBlock = 48;
  const int64_t blocks = (s.n + kBlock - 1) / kBlock;
  const bool threaded = blocks > 1 && s.n * s.k >= (int64_t{1} << 16) && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (threaded)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t j1 = std::min(s.n, (b + 1) * kBlock);
    int64_t j = b * kBlock;
    if (kernel != detail::QuantizedKernel::Avx2) {
      const bool dot = kernel == detail::QuantizedKernel::Avx512Bf16;
      const int pairs = (dot ? kDotPairCols : kPairCols)[m - 1];
      for (; j + 1 < j1; j += 2 * pairs) {
        const int here = static_cast<int>(std::min<int64_t>(pairs, (j1 - j) / 2));
        (dot ? dot_pair_tile_for : pair_tile_for)(static_cast<int>(m), here)(s, x, j, bias, c);
        if (here < pairs) j -= 2 * (pairs - here);  // the last pairs of the block
      }
    }
    const int cols = kFusedCols[m - 1];
    for (; j < j1; j += cols)
      fused_tile_for(static_cast<int>(m), static_cast<int>(std::min<int64_t>(cols, j1 - j)))(s, x, j, bias, c);
  }
}

}  // namespace

namespace detail {

QuantizedKernel quantized_decode_kernel(int bits, int64_t rows) {
  static const QuantizedKernel kernel = [] {
    const QuantizedKernel best = avx512_bf16_available() && !ordered_gemm_wanted() ? QuantizedKernel::Avx512Bf16
                                 : avx512_available()                                ? QuantizedKernel::Avx512
                                                                                     : QuantizedKernel::Avx2;
    const char* env = std::getenv("TP_QUANTIZED_ISA");
    if (env == nullptr || *env == 0) return best;
    const std::string v(env);
    TP_CHECK(v == "avx2" || v == "avx512" || v == "avx512bf16",
             "TP_QUANTIZED_ISA='{}' is not one of avx2, avx512, avx512bf16", v);
    const QuantizedKernel want = v == "avx2" ? QuantizedKernel::Avx2
                                 : v == "avx512" ? QuantizedKernel::Avx512 : QuantizedKernel::Avx512Bf16;
    TP_CHECK(want == QuantizedKernel::Avx2 || (want == QuantizedKernel::Avx512 ? avx512_available()
                                                                                : avx512_bf16_available()),
             "TP_QUANTIZED_ISA={}: this CPU does not have it", v);
    return want;
  }();
  // The dot-product kernel was no faster than the exact AVX-512 one on 8-bit codes (two lookups a weight:
  // |code - zero| < 256 is no exact bf16) nor on 3-4 rows (its registers spill), so it runs 1-2 rows of 4-bit ones.
  return kernel == QuantizedKernel::Avx512Bf16 && (bits != 4 || rows > kDotRows) ? QuantizedKernel::Avx512 : kernel;
}

}  // namespace detail

float QuantizedLinear::State::value(int64_t row, int64_t p) const {
  const int64_t g = group_at(p);
  return scale(row, g) * static_cast<float>(code(row, p) - zeros[row * groups + g]);
}

void QuantizedLinear::State::dequantize_rows(int64_t j0, int64_t j1, float* out) const {
  const int64_t chunks = static_cast<int64_t>(chunk_group.size());
  for (int64_t j = j0; j < j1; ++j) {
    float* dst = out + (j - j0) * k;
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t g = chunk_group[c];
      if (g < 0) {
        for (int64_t p = 32 * c; p < std::min(k, 32 * c + 32); ++p) dst[p] = value(j, p);
        continue;
      }
      __m256 v[4];
      chunk_values(chunk(j, c), bits, _mm256_set1_epi32(zeros[j * groups + g]), _mm256_set1_ps(scale(j, g)), v);
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + 32 * c + 8 * i, v[i]);
    }
  }
}

QuantizedLinear::QuantizedLinear(int bits, int64_t group_size, const Tensor& codes, const Tensor& scales,
                                 const Tensor& zeros, const Tensor& g_idx) {
  TP_CHECK(bits == 4 || bits == 8, "QuantizedLinear: bits must be 4 or 8, got {}", bits);
  TP_CHECK(codes.defined() && codes.dim() == 2 && codes.dtype() == DType::U8,
           "QuantizedLinear: codes must be u8 [out, in], got {} {}", codes.defined() ? dtype_name(codes.dtype()) : "",
           codes.defined() ? shape_str(codes.shape()) : "undefined");
  auto st = std::make_shared<State>();
  st->bits = bits;
  st->n = codes.size(0);
  st->k = codes.size(1);
  const int64_t n = st->n, k = st->k;
  TP_CHECK(g_idx.defined() || group_size > 0, "QuantizedLinear: group_size must be > 0 without g_idx, got {}",
           group_size);
  st->groups = g_idx.defined() ? scales.size(1) : (k + group_size - 1) / group_size;
  const int64_t groups = st->groups;
  TP_CHECK(scales.dim() == 2 && scales.size(0) == n && scales.size(1) == groups && scales.dtype() == DType::F32,
           "QuantizedLinear: scales must be f32 [{}, {}], got {} {}", n, groups, dtype_name(scales.dtype()),
           shape_str(scales.shape()));
  TP_CHECK(zeros.dim() == 2 && zeros.size(0) == n && zeros.size(1) == groups && zeros.dtype() == DType::U8,
           "QuantizedLinear: zeros must be u8 [{}, {}], got {} {}", n, groups, dtype_name(zeros.dtype()),
           shape_str(zeros.shape()));
  const int limit = 1 << bits;

  // Group of each input, then the run order: inputs sorted by group (stable).
  std::vector<int32_t> group_of(static_cast<size_t>(k));
  if (g_idx.defined()) {
    TP_CHECK(g_idx.dim() == 1 && g_idx.size(0) == k && g_idx.dtype() == DType::I32,
             "QuantizedLinear: g_idx must be i32 [{}], got {} {}", k, dtype_name(g_idx.dtype()),
             shape_str(g_idx.shape()));
    const int32_t* gi = g_idx.data<int32_t>();
    for (int64_t i = 0; i < k; ++i) {
      TP_CHECK(gi[i] >= 0 && gi[i] < groups, "QuantizedLinear: g_idx[{}] = {} is not a group in [0, {})", i, gi[i],
               groups);
      group_of[static_cast<size_t>(i)] = gi[i];
    }
  } else {
    for (int64_t i = 0; i < k; ++i) group_of[static_cast<size_t>(i)] = static_cast<int32_t>(i / group_size);
  }
  std::vector<int32_t> order(static_cast<size_t>(k));
  std::iota(order.begin(), order.end(), 0);
  if (!std::is_sorted(group_of.begin(), group_of.end())) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return group_of[a] < group_of[b]; });
    st->perm = order;
  }
  for (int64_t p = 0; p < k; ++p) {
    const int32_t g = group_of[static_cast<size_t>(order[static_cast<size_t>(p)])];
    if (p == 0 || g != st->run_group.back()) {
      st->run_start.push_back(p);
      st->run_group.push_back(g);
    }
  }
  st->run_start.push_back(k);
  for (int64_t c = 0; c < (k + 31) / 32; ++c) {
    const int64_t g = st->group_at(32 * c);
    const bool whole = 32 * c + 32 <= k && st->group_at(32 * c + 31) == g &&
                       std::upper_bound(st->run_start.begin(), st->run_start.end(), 32 * c) ==
                           std::upper_bound(st->run_start.begin(), st->run_start.end(), 32 * c + 31);
    st->chunk_group.push_back(whole ? static_cast<int32_t>(g) : -1);
  }

  st->lay_out_codes();
  st->codes.assign(st->code_bytes(), 0);
  const uint8_t* c = codes.data<uint8_t>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t p = 0; p < k; ++p) {
      const int v = c[r * k + order[static_cast<size_t>(p)]];
      TP_CHECK(v < limit, "QuantizedLinear: code [{}, {}] = {} does not fit in {} bits", r, order[p], v, bits);
      st->set_code(r, p, v);
    }

  const float* s = scales.data<float>();
  bool f16_exact = true;
  for (int64_t i = 0; i < n * groups; ++i) {
    TP_CHECK(std::isfinite(s[i]), "QuantizedLinear: scale [{}, {}] is {}", i / groups, i % groups, s[i]);
    f16_exact = f16_exact && to_f32(to_f16(s[i])) == s[i];
  }
  if (f16_exact) {
    st->scales16.resize(static_cast<size_t>(n * groups));
    for (int64_t i = 0; i < n * groups; ++i) st->scales16[i] = to_f16(s[i]).bits;
  } else {
    st->scales32.assign(s, s + n * groups);
  }
  const uint8_t* z = zeros.data<uint8_t>();
  for (int64_t i = 0; i < n * groups; ++i)
    TP_CHECK(z[i] < limit, "QuantizedLinear: zero point [{}, {}] = {} does not fit in {} bits", i / groups,
             i % groups, z[i], bits);
  st->zeros.assign(z, z + n * groups);
  state_ = std::move(st);
}

int QuantizedLinear::bits() const { return state_ ? state_->bits : 0; }
int64_t QuantizedLinear::out_features() const { return state_ ? state_->n : 0; }
int64_t QuantizedLinear::in_features() const { return state_ ? state_->k : 0; }
int64_t QuantizedLinear::groups() const { return state_ ? state_->groups : 0; }

size_t QuantizedLinear::nbytes() const {
  if (!state_) return 0;
  const State& s = *state_;
  return s.codes.size() + s.scales16.size() * 2 + s.scales32.size() * 4 + s.zeros.size() + s.perm.size() * 4;
}

size_t QuantizedLinear::resident_bytes(int bits, int64_t n, int64_t k, int64_t groups, bool permuted) {
  State s;
  s.bits = bits;
  s.n = n;
  s.k = k;
  s.lay_out_codes();
  return s.code_bytes() + static_cast<size_t>(n * groups) * 3 + (permuted ? static_cast<size_t>(k) * 4 : 0);
}

Tensor QuantizedLinear::dequantize() const {
  TP_CHECK(defined(), "QuantizedLinear::dequantize: no weight");
  const State& s = *state_;
  Tensor out = Tensor::empty({s.n, s.k});
  s.dequantize_rows(0, s.n, out.data<float>());
  if (s.perm.empty()) return out;
  Tensor ordered = Tensor::empty({s.n, s.k});
  const float* src = out.data<float>();
  float* dst = ordered.data<float>();
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t p = 0; p < s.k; ++p) dst[r * s.k + s.perm[static_cast<size_t>(p)]] = src[r * s.k + p];
  return ordered;
}

Tensor linear(const Tensor& x, const QuantizedLinear& w, const Tensor& b) {
  TP_CHECK(w.defined(), "linear: the quantized weight is not loaded");
  Shape shape = x.shape();
  TP_CHECK(!shape.empty(), "linear: input must have at least one dim");
  shape.back() = w.out_features();
  Tensor out = Tensor::empty(shape);
  linear_into(out, x, w, b);
  return out;
}

void linear_into(Tensor& out, const Tensor& x, const QuantizedLinear& w, const Tensor& b) {
  TP_CHECK(w.defined(), "linear: the quantized weight is not loaded");
  const QuantizedLinear::State& s = *w.state_;
  TP_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == s.k && x.dtype() == DType::F32,
           "linear: input must be f32 [..., {}] for this quantized weight [{}, {}], got {} {}", s.k, s.n, s.k,
           x.defined() ? dtype_name(x.dtype()) : "", x.defined() ? shape_str(x.shape()) : "undefined");
  const int64_t m = s.k == 0 ? 0 : x.numel() / s.k;
  TP_CHECK(out.dtype() == DType::F32 && out.numel() == m * s.n, "linear: output must be f32 with {} x {} values",
           m, s.n);
  Tensor bias = b.defined() && b.dtype() != DType::F32 ? b.to(DType::F32) : b;
  TP_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == s.n), "linear: bias shape {} does not match [{}]",
           shape_str(bias.shape()), s.n);
  const float* a = x.data<float>();
  if (!s.perm.empty()) {  // act-order: x's inputs in run order
    thread_local std::vector<float> permuted;
    permuted.resize(static_cast<size_t>(m * s.k));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < s.k; ++p) permuted[i * s.k + p] = a[i * s.k + s.perm[static_cast<size_t>(p)]];
    a = permuted.data();
  }
  if (m == 0 || s.n == 0) return;
  const float* bias_ptr = bias.defined() ? bias.data<float>() : nullptr;
  if (m <= kFusedRows) {
    fused_product(s, m, a, bias_ptr, out.data<float>());
    return;
  }
  detail::ordered_gemm_filled(m, s.n, s.k, a, s.k, &fill_rows, &s, bias_ptr, out.data<float>(), s.n);
}

}  // namespace tp::ops
