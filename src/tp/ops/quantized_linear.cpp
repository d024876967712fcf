#include "tp/ops/quantized_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/quantized_linear_kernels.h"
#include "tp/ops/gemm.h"
#include "tp/ops/ordered_gemm.h"
#include "tp/tensor/convert.h"
#include "tp/tensor/storage.h"

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
  // The codes' bytes on huge pages, as a PackedLinear's weights are (Storage::allocate_exact), whatever
  // malloc does: decode streams them once a token, and from a vector on 4 KiB pages (without tprun's
  // glibc.malloc.hugetlb=1) one row of a 4096 x 4096 int8 weight took 0.98 ms against 0.75, int4's 0.69
  // against 0.45 (AMD EPYC).
  struct CodeBytes {
    std::shared_ptr<Storage> storage;
    size_t bytes = 0;
    void assign_zeros(size_t n) {
      bytes = n;
      storage = Storage::allocate_exact((n + 63) / 64 * 64);
      std::memset(storage->data(), 0, n);
    }
    uint8_t* data() const { return storage ? static_cast<uint8_t*>(storage->data()) : nullptr; }
    size_t size() const { return bytes; }
    uint8_t& operator[](size_t i) const { return data()[i]; }
  };
  CodeBytes codes;  // panels, then the tails; inputs in run order
  // Scales and zero points by panel: a panel's 8 rows' of one group side by side (param_at), so that a
  // kernel takes a panel's group in one load.
  std::vector<uint16_t> scales16;   // as f16 when every scale is one exactly,
  std::vector<float> scales32;      // else as f32
  std::vector<uint8_t> zeros;       // empty: every zero point is 0 (mapped codes)
  // A 4-bit code's value before its group's zero point and scale: the code itself, or (mapped: MXFP4's E2M1)
  // code_value[code], a small integer.
  bool mapped = false;
  std::array<int8_t, 16> code_value{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<int64_t> run_start;   // runs of inputs (in run order) that share a group: [runs + 1]
  std::vector<int32_t> run_group;   // each run's group
  std::vector<int32_t> perm;        // act-order: run-order position p holds input perm[p]; empty: identity
  // Per chunk of 32 inputs: the group of all its inputs, or -1 when they are not
  // all in one (a run's edge, the last K % 32): such chunks are read one by one.
  std::vector<int32_t> chunk_group;
  bool chunks_whole = false;  // every chunk is whole (no -1 above): K % 32 == 0 and no run edge inside a chunk

  // Lane panels, the layout of the integer kernels' lane_tile, held instead of the panels above where it runs
  // (plain 4- and 8-bit codes, whole chunks, rows a multiple of 64): 64 rows a panel, and in a panel each run as
  // its parameters (the 64 rows' scales, f16 or f32, then their 64 zero points) followed by its steps, a step 64
  // 32-bit words, word r row r's codes of the step's inputs: 8 of them for 4-bit codes (byte b: input 8t + b in
  // its low nibble, 8t + 4 + b in its high one), 4 for 8-bit ones (byte b: input 4t + b). A token's product then reads
  // one run of memory, its scales in it. (As a stream of their own the scales cost a stand-alone loop with the kernel's
  // arithmetic 12% of its rate, bench_decode_stream.) `codes` holds it all; scales16, scales32 and zeros stay empty.
  // Mapped codes (MXFP4) keep no zero points there (they are all 0): the kernels read code c as the unsigned byte
  // code_value[c] + kMappedOffset with a zero point of kMappedOffset.
  static constexpr int64_t kLanePanel = 64;
  static constexpr int64_t kLaneStepBytes = kLanePanel * 4;  // a step's 64 words
  static constexpr int kMappedOffset = 12;                   // -min(code_value) of MXFP4's E2M1 values
  int64_t lane_step_inputs() const { return 32 / bits; }
  bool lanes = false;
  int64_t lane_scale_bytes = 2;  // 2 (f16) or 4 (f32)
  int64_t lane_param_bytes = 0;  // a run's parameters in a panel
  int64_t lane_panel_bytes = 0;
  std::vector<int64_t> lane_run_offset;  // each run's parameters within a panel; its codes follow them
  std::vector<int32_t> group_run;        // each group's run, -1 for a group without inputs
  size_t lane_run_at(int64_t row, size_t run) const {
    return static_cast<size_t>(row / kLanePanel * lane_panel_bytes + lane_run_offset[run]);
  }
  void lay_out_lanes(bool f16_scales) {
    lanes = true;
    lane_scale_bytes = f16_scales ? 2 : 4;
    lane_param_bytes = kLanePanel * (lane_scale_bytes + (mapped ? 0 : 1));
    group_run.assign(static_cast<size_t>(groups), -1);
    lane_run_offset.clear();
    int64_t at = 0;
    for (size_t r = 0; r + 1 < run_start.size(); ++r) {
      group_run[static_cast<size_t>(run_group[r])] = static_cast<int32_t>(r);
      lane_run_offset.push_back(at);
      at += lane_param_bytes + (run_start[r + 1] - run_start[r]) / lane_step_inputs() * kLaneStepBytes;
    }
    lane_panel_bytes = at;
  }

  // Where row `row`'s scale and zero point of `group` are kept; param_count() entries in all.
  size_t param_at(int64_t row, int64_t group) const {
    return static_cast<size_t>((row / kPanel * groups + group) * kPanel + row % kPanel);
  }
  size_t param_count() const { return static_cast<size_t>((n + kPanel - 1) / kPanel * kPanel * groups); }
  int zero(int64_t row, int64_t group) const {
    if (lanes && mapped) return 0;
    if (lanes)
      return codes[lane_run_at(row, static_cast<size_t>(group_run[static_cast<size_t>(group)])) +
                   static_cast<size_t>(kLanePanel * lane_scale_bytes + row % kLanePanel)];
    return zeros.empty() ? 0 : zeros[param_at(row, group)];
  }
  float scale(int64_t row, int64_t group) const {
    if (lanes) {
      const uint8_t* at = codes.data() + lane_run_at(row, static_cast<size_t>(group_run[static_cast<size_t>(group)])) +
                          row % kLanePanel * lane_scale_bytes;
      if (lane_scale_bytes == 2) {
        uint16_t half;
        std::memcpy(&half, at, 2);
        return _cvtsh_ss(half);
      }
      float single;
      std::memcpy(&single, at, 4);
      return single;
    }
    const size_t i = param_at(row, group);
    return scales16.empty() ? scales32[i] : _cvtsh_ss(scales16[i]);
  }
  // Where row `row`'s codes of chunk ch (< chunks32) start in `codes`, and a pointer there.
  size_t chunk_offset(int64_t row, int64_t ch) const {
    return static_cast<size_t>(((row / kPanel * chunks32 + ch) * kPanel + row % kPanel) * chunk_bytes);
  }
  const uint8_t* chunk(int64_t row, int64_t ch) const { return codes.data() + chunk_offset(row, ch); }
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
    if (lanes) {
      const size_t run = run_of(p);
      const int64_t t = p - run_start[run], step = t / lane_step_inputs(), in_step = t % lane_step_inputs();
      return {lane_run_at(row, run) +
                  static_cast<size_t>(lane_param_bytes + step * kLaneStepBytes + row % kLanePanel * 4 + in_step % 4),
              in_step < 4 ? 0 : 4};
    }
    const int64_t k32 = chunks32 * 32;
    if (p < k32) {
      const size_t base = chunk_offset(row, p / 32);
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
  // Row `row`'s whole chunk ch from its 32 codes in run order (the codes' bytes there still zero).
  void set_chunk(int64_t row, int64_t ch, const uint8_t* values) {
    uint8_t* dst = codes.data() + chunk_offset(row, ch);
    if (bits == 8) {
      std::memcpy(dst, values, 32);
    } else {
      for (int j = 0; j < 16; ++j) dst[j] = static_cast<uint8_t>(values[j] | (values[j + 16] << 4));
    }
  }
  void set_code(int64_t row, int64_t p, int value) {
    const auto [byte, shift] = code_at(row, p);
    codes[byte] = static_cast<uint8_t>(codes[byte] | (value << shift));
  }
  // Lane panels: row `row`'s words from its k codes in run order, and its scale and zero point of `group`.
  void set_lane_words(int64_t row, const uint8_t* values) {
    for (size_t run = 0; run + 1 < run_start.size(); ++run) {
      uint8_t* word = codes.data() + lane_run_at(row, run) + lane_param_bytes + row % kLanePanel * 4;
      for (int64_t p = run_start[run]; p < run_start[run + 1]; p += lane_step_inputs(), word += kLaneStepBytes)
        for (int b = 0; b < 4; ++b)
          word[b] = bits == 8 ? values[p + b] : static_cast<uint8_t>(values[p + b] | (values[p + 4 + b] << 4));
    }
  }
  void set_lane_params(int64_t row, int64_t group, float scale, uint8_t zero) {
    const int32_t run = group_run[static_cast<size_t>(group)];
    if (run < 0) return;  // no input in the group
    uint8_t* at = codes.data() + lane_run_at(row, static_cast<size_t>(run));
    if (lane_scale_bytes == 2) {
      const uint16_t half = to_f16(scale).bits;
      std::memcpy(at + row % kLanePanel * 2, &half, 2);
    } else {
      std::memcpy(at + row % kLanePanel * 4, &scale, 4);
    }
    if (!mapped) at[kLanePanel * lane_scale_bytes + row % kLanePanel] = zero;
  }

  size_t run_of(int64_t p) const {
    return static_cast<size_t>(std::upper_bound(run_start.begin(), run_start.end(), p) - run_start.begin() - 1);
  }
  int64_t group_at(int64_t p) const { return run_group[run_of(p)]; }
  // W[row, input at run-order position p] as f32.
  float value(int64_t row, int64_t p) const;
  // W's rows [j0, j1) as f32 [j1 - j0, k] (row stride ld, 0: k), inputs in run order.
  void dequantize_rows(int64_t j0, int64_t j1, float* out, int64_t ld = 0) const;
  void dequantize_lane_rows(int64_t j0, int64_t j1, float* out, int64_t ld) const;
  // The same values rounded to bf16 (round to nearest even).
  void dequantize_rows_bf16(int64_t j0, int64_t j1, bf16* out, int64_t ld) const;
};

namespace {

// The four vectors of eight W values of chunk c (inputs 32c ..< 32c + 32 of one
// row, all in one group): scale * (code - zero) (mapped codes: code_value[code] - zero), in input order.
inline void chunk_values(const QuantizedLinear::State& s, const uint8_t* codes, __m256i zero, __m256 scale,
                         __m256 out[4]) {
  __m256i v[4];
  if (s.bits == 8) {
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
    if (s.mapped) {  // code_value[v]: the low or high eight values by the code's bit 3
      const __m256i low = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.code_value.data())));
      const __m256i high =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.code_value.data() + 8)));
      const __m256i seven = _mm256_set1_epi32(7);
      for (int i = 0; i < 4; ++i)
        v[i] = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(low, v[i]), _mm256_permutevar8x32_epi32(high, v[i]),
                                  _mm256_cmpgt_epi32(v[i], seven));
    }
  }
  for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(v[i], zero)));
}

// x's rows as the decode kernels read them: f32, and (the integer dot-product kernel) each row as 16-bit
// integers q with one scale, x ~ scale * q.
struct Rows {
  const float* a;
  const int16_t* q;
  const float* q_scale;
  // The byte kernel's form of q: q = 256 * high + low, and each row's sums of q before each chunk
  // (prefix[i * (chunks + 1) + ch]: inputs 0 ..< 32 ch).
  const uint8_t* low = nullptr;
  const int8_t* high = nullptr;
  const int64_t* prefix = nullptr;
  const int64_t* low_prefix = nullptr;  // the same sums of the low bytes (the 8-bit lane kernel's)
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
        chunk_values(s, s.chunk(row, ch), _mm256_set1_epi32(s.zero(row, g)),
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
constexpr int kDotRows = 4;  // the AVX512-VNNI kernel's (quantized_decode_kernel)
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
  const int za = s.zero(ra, g), zb = s.zero(ra + 1, g);
  if (s.bits == 4) {
    const __m512i values = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.code_value.data())));
    ps.table_a = _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_cvtepi32_ps(_mm512_sub_epi32(values, _mm512_set1_epi32(za))));
    ps.table_b = _mm512_mul_ps(_mm512_set1_ps(sb), _mm512_cvtepi32_ps(_mm512_sub_epi32(values, _mm512_set1_epi32(zb))));
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

// Few rows (decode) with AVX512-VNNI: VPDPWSSD multiplies 32 pairs of 16-bit integers into 16 sums a lane, so
// a weight costs fewer instructions than in the exact kernels above, which are bound by them (their decode ran
// at 0.45x (8-bit) and 0.9x (4-bit) bf16's rate). Each row of x is quantized once per call to 16-bit integers
// with one scale (x ~ sx * xq, sx = max |x| / 32767); W's values are code - zero, exact 16-bit integers (a
// 4-bit code's by one VPERMW lookup in its group's table, an 8-bit one's by a widening and a subtraction).
// Per group, with W's rows a and b of a pair in the two halves of a register:
//   acc += xq . (code - zero)                  (exact, in 32-bit integers; emptied every 512 inputs too)
//   total += (scale * sx) * float(acc)        (each lane, at the group's end)
// so the only roughly rounding is x's: the product is within sx / 2 * sum |w| (+ f32 rounding) of the exact one
// (tested), rather than ordered_gemm's bits; a row's output does not depend on the rows around it.
// TP_GEMM=ordered keeps the exact kernels.
#define TP_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

bool avx512_vnni_available() {
  static const bool available = avx512_available() && __builtin_cpu_supports("avx512vnni");
  return available;
}

// x's rows [m, k] as 16-bit integers, each row with its scale: q = round(x / scale), scale = max |x| / 32767
// (0 for a row of zeros).
TP_AVX512_VNNI void quantize_rows(const float* a, int64_t m, int64_t k, int16_t* q, float* scale) {
  for (int64_t r = 0; r < m; ++r) {
    const float* x = a + r * k;
    __m512 top = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 mask = k - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k - i)) - 1);
      top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, x + i)));
    }
    const float max = _mm512_reduce_max_ps(top);
    scale[r] = max / 32767.f;
    const __m512 inverse = _mm512_set1_ps(max > 0 ? 32767.f / max : 0.f);
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 mask = k - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k - i)) - 1);
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inverse));
      _mm256_mask_storeu_epi16(q + r * k + i, mask, _mm512_cvtsepi32_epi16(v));
    }
  }
}

// A row pair's state in group g: its scales (one a half), and for 4-bit codes the lookup table (words 0-15 row
// a's code - zero for each code, 16-31 row b's), for 8-bit ones the zero points (a half each, as words).
struct DotPair {
  __m512i table;
  __m512 scale;
};

TP_AVX512_VNNI inline void dot_pair_group(const QuantizedLinear::State& s, int64_t ra, int32_t g, DotPair& dp) {
  // Rows a and b from their panel's 8 scales and zero points (one load each): a's in lanes 0-7, b's in 8-15.
  constexpr int64_t kPanel = QuantizedLinear::State::kPanel;
  const size_t at = s.param_at(ra - ra % kPanel, g);
  const int a = static_cast<int>(ra % kPanel);
  const __m512i rows = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(a), _mm512_set1_epi32(a + 1));
  const __m256 scales = s.scales16.empty() ? _mm256_loadu_ps(s.scales32.data() + at)
                                           : _mm256_cvtph_ps(_mm_loadu_si128(
                                                 reinterpret_cast<const __m128i*>(s.scales16.data() + at)));
  dp.scale = _mm512_permutexvar_ps(rows, _mm512_castps256_ps512(scales));
  __m512i zero = _mm512_setzero_si512();  // as words: a's in words 0-15, b's in 16-31
  if (!s.zeros.empty()) {
    const __m256i zeros = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.zeros.data() + at)));
    zero = _mm512_permutexvar_epi32(rows, _mm512_castsi256_si512(zeros));
    zero = _mm512_or_si512(zero, _mm512_slli_epi32(zero, 16));
  }
  if (s.bits == 4) {
    const __m512i values = _mm512_broadcast_i64x4(
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.code_value.data()))));
    dp.table = _mm512_sub_epi16(values, zero);
  } else {
    dp.table = zero;
  }
}

// Row pair (ra, ra + 1)'s W values of one chunk from its codes `row_a` (row a's, row b's chunk_bytes after) as
// words: w[0] inputs p ..< p + 16, w[1] p + 16 ..< p + 32, row a's in the low half, row b's in the high one.
template <int BITS>
TP_AVX512_VNNI inline void dot_pair_values(const uint8_t* row_a, const DotPair& dp, __m512i w[2]) {
  if constexpr (BITS == 4) {
    // 16 code bytes of row a then 16 of row b; low nibbles are inputs p ..< p + 16, high ones the rest.
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_a)));
    const __m512i upper = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
    const __m512i lo = _mm512_ternarylogic_epi32(bytes, _mm512_set1_epi16(15), upper, 0xEA);  // (b & 15) | upper
    const __m512i hi = _mm512_or_si512(_mm512_srli_epi16(bytes, 4), upper);
    w[0] = _mm512_permutexvar_epi16(lo, dp.table);
    w[1] = _mm512_permutexvar_epi16(hi, dp.table);
  } else {
    const uint8_t* row_b = row_a + 32;
    for (int h = 0; h < 2; ++h) {
      const __m256i bytes = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_a + 16 * h))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(row_b + 16 * h)), 1);
      w[h] = _mm512_sub_epi16(_mm512_cvtepu8_epi16(bytes), dp.table);
    }
  }
}

// 16 values of x's row (inputs p ..< p + 16) in both halves.
TP_AVX512_VNNI inline __m512i both_halves(const int16_t* x) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}

// Accumulators a (row, pair): two for one row of x, so that its products do not wait on each other; one for
// more rows, whose (row, pair) chains are already independent (and registers are short).
template <int MR>
constexpr int kAccumulators = MR == 1 ? 2 : 1;

// The integer sums so far, times the group's scales and x's, into the totals.
template <int MR, int NP>
TP_AVX512_VNNI inline void flush_groups(__m512i (&acc)[kAccumulators<MR>][MR][NP], const DotPair (&dp)[NP],
                                        const float* q_scale, __m512 (&total)[MR][NP]) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      __m512i sum = acc[0][i][q];
      if constexpr (kAccumulators<MR> == 2) sum = _mm512_add_epi32(sum, acc[1][i][q]);
      total[i][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dp[q].scale, _mm512_set1_ps(q_scale[i])),
                                    total[i][q]);
      for (int a = 0; a < kAccumulators<MR>; ++a) acc[a][i][q] = _mm512_setzero_si512();
    }
}

// Chunks between flushes within a group: 16 (512 inputs) keep each accumulator's lanes under 2^30 in magnitude
// (16 chunks x 4 products of at most 255 x 32767), their sum in 32 bits.
constexpr int64_t kFlushChunks = 16;

template <int MR, int NP, int BITS>
TP_AVX512_VNNI void dot_pair_tile(const QuantizedLinear::State& s, const Rows& x, int64_t j, const float* bias,
                                  float* c) {
  constexpr int A = kAccumulators<MR>;
  const int64_t k = s.k;
  const int64_t chunks = static_cast<int64_t>(s.chunk_group.size());
  // Each pair's codes of chunk 0; a chunk's are a panel's chunk further on (State::chunk).
  const uint8_t* codes[NP];
  for (int q = 0; q < NP; ++q) codes[q] = s.chunk(j + 2 * q, 0);
  const int64_t chunk_stride = QuantizedLinear::State::kPanel * s.chunk_bytes;
  __m512 total[MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NP; ++q) total[i][q] = _mm512_setzero_ps();
  DotPair dp[NP];
  int32_t group = -1;
  for (int64_t ch = 0; ch < chunks;) {
    const int32_t g = s.chunk_group[ch];
    if (g < 0) {  // f32 values into the totals, through a copy (an array whose address escapes stays in memory)
      __m512 spilled[MR][NP];
      std::memcpy(spilled, total, sizeof(total));
      straddling_chunk<MR, NP>(s, x.a, j, 32 * ch, spilled);
      std::memcpy(total, spilled, sizeof(total));
      ++ch;
      continue;
    }
    // A run of chunks in group g, at most kFlushChunks: the integer sums stay in registers over it.
    int64_t end = ch + 1;
    while (end < chunks && end - ch < kFlushChunks && s.chunk_group[end] == g) ++end;
    if (g != group)
      for (int q = 0; q < NP; ++q) dot_pair_group(s, j + 2 * q, g, dp[q]);
    group = g;
    __m512i acc[A][MR][NP];
    for (int a = 0; a < A; ++a)
      for (int i = 0; i < MR; ++i)
        for (int q = 0; q < NP; ++q) acc[a][i][q] = _mm512_setzero_si512();
    for (; ch < end; ++ch) {
      const int64_t p = 32 * ch;
      __m512i xv[MR][2];  // x's 32 values of this chunk, each half in both halves of a register: once for every pair
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        xv[i][0] = both_halves(x.q + i * k + p);
        xv[i][1] = both_halves(x.q + i * k + p + 16);
      }
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) {
        __m512i w[2];
        dot_pair_values<BITS>(codes[q] + ch * chunk_stride, dp[q], w);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          acc[0][i][q] = _mm512_dpwssd_epi32(acc[0][i][q], w[0], xv[i][0]);
          acc[A - 1][i][q] = _mm512_dpwssd_epi32(acc[A - 1][i][q], w[1], xv[i][1]);
        }
      }
    }
    flush_groups<MR, NP>(acc, dp, x.q_scale, total);
  }
  __m512 out[MR][NP];
  std::memcpy(out, total, sizeof(total));
  store_pair_rows<MR, NP>(s, x.a, j, out, bias, c);
}

constexpr int kDotPairCols[kDotRows] = {4, 3, 2, 2};

template <int MR, int NP>
struct DotPairTile4 {
  static constexpr FusedTileFn fn = &dot_pair_tile<MR, NP, 4>;
};
template <int MR, int NP>
struct DotPairTile8 {
  static constexpr FusedTileFn fn = &dot_pair_tile<MR, NP, 8>;
};

FusedTileFn dot_pair_tile_for(int bits, int rows, int pairs) {
  constexpr int c0 = kDotPairCols[0], c1 = kDotPairCols[1], c2 = kDotPairCols[2], c3 = kDotPairCols[3];
  return bits == 4 ? tile_for<DotPairTile4, c0, c1, c2, c3>(rows, pairs)
                   : tile_for<DotPairTile8, c0, c1, c2, c3>(rows, pairs);
}

// The byte kernel's tile streams its codes once, front to back, with much arithmetic per byte, and the
// hardware prefetcher alone then left the memory idle part of the time: on an AMD EPYC it read 20-23 GB/s
// where bf16's decode kernel reads 32-38. So the tile prefetches into L2 a little ahead of itself: the codes
// 4 KiB on, its panel's scales and zero points 4 groups on. Neither changes a bit. (The 8-bit pair kernel
// gained nothing measurable from the same, so it has none.)
constexpr int64_t kCodePrefetchBytes = 4096;
constexpr int32_t kParamPrefetchGroups = 4;

// The address may lie past the codes (the last chunks' prefetch): a prefetch never faults, and the address is
// formed as an integer, not as a pointer past its array. Both helpers are always inlined: GCC 12 deems a
// function of prefetches alone pure and may drop its calls (it did so to attention's).
[[gnu::always_inline]] inline void prefetch_codes(const uint8_t* chunk) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(chunk) + kCodePrefetchBytes), _MM_HINT_T1);
}

// Row `row`'s panel's scales and zero points kParamPrefetchGroups after group g, when there is such a group.
[[gnu::always_inline]] inline void prefetch_params(const QuantizedLinear::State& s, int64_t row, int32_t g) {
  if (g + kParamPrefetchGroups >= s.groups) return;
  const size_t at = s.param_at(row, g + kParamPrefetchGroups);
  _mm_prefetch(s.scales16.empty() ? reinterpret_cast<const char*>(s.scales32.data() + at)
                                  : reinterpret_cast<const char*>(s.scales16.data() + at),
               _MM_HINT_T1);
  if (!s.zeros.empty()) _mm_prefetch(reinterpret_cast<const char*>(s.zeros.data() + at), _MM_HINT_T1);
}

// 4-bit codes on AVX512-VNNI by byte products (VPDPBUSD: 64 products of an unsigned and a signed byte, summed
// four at a time into 16 lanes), four rows of W a register: one load of a chunk's 64 code bytes holds rows
// r ..< r + 4 (16 bytes each, one 128-bit lane a row), a mask and a shift give their codes as bytes, and each
// feeds the instruction as stored, with no lookup. x's 16-bit integers are split into bytes,
// q = 256 * high + low (high signed, low unsigned), so both byte products are the instruction's:
// code (u8) x high (s8) and low (u8) x code (s8, 0-15). The zero point comes off once per run of chunks, as
// zero * (the sum of q over the run). So the integer sums are the pair kernel's, exactly:
//   acc = 256 * code.high + low.code - zero * sum q = q . (code - zero)
// at half its instructions per weight (a chunk of four rows: one load, three bit operations and four VPDPBUSD,
// where two row pairs take two widening loads, six bit operations, four VPERMW and four VPDPWSSD). Only the
// order of the f32 sums differs; the bound (kRowQuantized in the tests) is the same. For plain 4-bit codes
// (not MXFP4's mapped ones, which can be negative) whose chunks are all whole.
struct DotQuad {
  __m512 scale;  // each row's scale in its 128-bit lane
  __m512i zero;  // each row's zero point in the first 32-bit lane of its 128-bit lane, 0 in the other three
};

// The group-g scales and zero points of quads q ..< NQ (rows j + 4q ..< j + 4q + 4, j a multiple of 4, all in
// one panel): one load of the panel's 8 of each, and a permutation a quad.
template <int NQ>
TP_AVX512_VNNI inline void dot_quad_groups(const QuantizedLinear::State& s, int64_t j, int32_t g, DotQuad (&dq)[NQ]) {
  constexpr int64_t kPanel = QuantizedLinear::State::kPanel;
  const size_t at = s.param_at(j - j % kPanel, g);
  const __m256 scales = s.scales16.empty() ? _mm256_loadu_ps(s.scales32.data() + at)
                                           : _mm256_cvtph_ps(_mm_loadu_si128(
                                                 reinterpret_cast<const __m128i*>(s.scales16.data() + at)));
  const __m256i zeros = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.zeros.data() + at)));
  const int first = static_cast<int>(j % kPanel);
  for (int q = 0; q < NQ; ++q) {
    // Row first + 4q + r of the panel in 128-bit lane r.
    const __m512i lane_row = _mm512_add_epi32(_mm512_set1_epi32(first + 4 * q),
                                              _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    dq[q].scale = _mm512_permutexvar_ps(lane_row, _mm512_castps256_ps512(scales));
    dq[q].zero = _mm512_maskz_permutexvar_epi32(0x1111, lane_row, _mm512_castsi256_si512(zeros));
  }
}

// 64 bytes of 4-bit codes as two vectors of bytes, the low nibbles and the high ones (which inputs each holds is
// the layout's), the codes 4 KiB ahead prefetched.
TP_AVX512_VNNI inline void load_codes(const uint8_t* at, __m512i code[2]) {
  prefetch_codes(at);
  const __m512i bytes = _mm512_loadu_si512(at);
  const __m512i nibble = _mm512_set1_epi8(15);
  code[0] = _mm512_and_si512(bytes, nibble);
  code[1] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
}

// Both code vectors' byte products with x's split bytes for them: code . high into high_sum, low . code into
// low_sum.
TP_AVX512_VNNI inline void byte_products(const __m512i code[2], const __m512i high[2], const __m512i low[2],
                                         __m512i& high_sum, __m512i& low_sum) {
  for (int h = 0; h < 2; ++h) {
    high_sum = _mm512_dpbusd_epi32(high_sum, code[h], high[h]);
    low_sum = _mm512_dpbusd_epi32(low_sum, low[h], code[h]);
  }
}

// 16 bytes of x's split row (inputs p ..< p + 16) in every 128-bit lane.
TP_AVX512_VNNI inline __m512i every_lane(const void* bytes) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(static_cast<const __m128i*>(bytes)));
}

template <int MR, int NQ>
TP_AVX512_VNNI void dot_quad_tile(const QuantizedLinear::State& s, const Rows& x, int64_t j, const float* bias,
                                  float* c) {
  const int64_t k = s.k, chunks = s.chunks32;
  const uint8_t* codes[NQ];  // each quad's codes of chunk 0 (j is a multiple of 4: its rows are one run of bytes)
  for (int q = 0; q < NQ; ++q) codes[q] = s.chunk(j + 4 * q, 0);
  const int64_t chunk_stride = QuantizedLinear::State::kPanel * s.chunk_bytes;
  __m512 total[MR][NQ];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NQ; ++q) total[i][q] = _mm512_setzero_ps();
  DotQuad dq[NQ] = {};
  int32_t group = -1;
  for (int64_t ch = 0; ch < chunks;) {
    const int32_t g = s.chunk_group[ch];
    // A run of chunks in group g, at most kFlushChunks: the integer sums stay in registers over it.
    const int64_t first = ch;
    int64_t end = ch + 1;
    while (end < chunks && end - ch < kFlushChunks && s.chunk_group[end] == g) ++end;
    if (g != group) {
      dot_quad_groups<NQ>(s, j, g, dq);
      prefetch_params(s, j, g);
    }
    group = g;
    __m512i high_sum[MR][NQ], low_sum[MR][NQ];
    for (int i = 0; i < MR; ++i)
      for (int q = 0; q < NQ; ++q) high_sum[i][q] = low_sum[i][q] = _mm512_setzero_si512();
    for (; ch < end; ++ch) {
      const int64_t p = 32 * ch;
      __m512i xh[MR][2], xl[MR][2];  // x's chunk, split, each 16 inputs in every lane: once for every quad
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i)
        for (int h = 0; h < 2; ++h) {
          xh[i][h] = every_lane(x.high + i * k + p + 16 * h);
          xl[i][h] = every_lane(x.low + i * k + p + 16 * h);
        }
#pragma GCC unroll 4
      for (int q = 0; q < NQ; ++q) {
        __m512i code[2];  // inputs p ..< p + 16 of each row, then p + 16 ..< p + 32
        load_codes(codes[q] + ch * chunk_stride, code);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) byte_products(code, xh[i], xl[i], high_sum[i][q], low_sum[i][q]);
      }
    }
    // Lanes stay under 2^31: 16 chunks of 8 products a lane, 256 * 15 * 128 + 15 * 255 each, and
    // zero * sum q within 15 * 512 * 32767.
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const int64_t* prefix = x.prefix + i * (chunks + 1);
      const __m512i run_sum = _mm512_set1_epi32(static_cast<int32_t>(prefix[end] - prefix[first]));
      const __m512 x_scale = _mm512_set1_ps(x.q_scale[i]);
#pragma GCC unroll 4
      for (int q = 0; q < NQ; ++q) {
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(high_sum[i][q], 8), low_sum[i][q]),
                                             _mm512_mullo_epi32(dq[q].zero, run_sum));
        total[i][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dq[q].scale, x_scale), total[i][q]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NQ; ++q) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, total[i][q]);
      for (int r = 0; r < 4; ++r) {
        const int64_t row = j + 4 * q + r;
        const float sum = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]);
        c[i * s.n + row] = bias != nullptr ? sum + bias[row] : sum;
      }
    }
}

// Quads a tile: two, one panel of 8 rows, whose codes are one run of memory read front to back. (Measured on
// an AMD EPYC with AVX512-VNNI, one row of x against 4096 x 4096: 0.44 ms a product with two quads a tile,
// 0.64 ms with four, whose two panels are two streams 16 KiB apart; the pair kernel took 0.60.)
constexpr int kDotQuadCols[kDotRows] = {2, 2, 2, 2};

template <int MR, int NQ>
struct DotQuadTile {
  static constexpr FusedTileFn fn = &dot_quad_tile<MR, NQ>;
};

FusedTileFn dot_quad_tile_for(int rows, int quads) {
  return tile_for<DotQuadTile, kDotQuadCols[0], kDotQuadCols[1], kDotQuadCols[2], kDotQuadCols[3]>(rows, quads);
}

bool byte_kernel_fits(const QuantizedLinear::State& s) { return s.bits == 4 && !s.mapped && s.chunks_whole; }

// The byte kernels' products on lane panels (State::lanes): MR rows of x (1 or 2) against one panel of 64 rows
// of W, a row of W in each 32-bit lane, so that x arrives as 4 bytes broadcast and a run's scales and zero
// points are read once per flush from just ahead of its codes. A step (8 inputs of 4-bit codes, 4 of 8-bit ones)
// is four loads and (a row of x) four VPDPBUSD a load for 4-bit codes (three bit operations split the nibbles),
// two for 8-bit ones (one XOR makes the codes signed bytes, c - 128, for the low bytes' product, 128 * sum low
// added back at the flush). The codes are prefetched 4 KiB ahead into L2, as the quad kernel's; with both the
// stream is no longer capped near 23 GB/s (one decode token's int4 linears with lm_head, bench_matmul
// --benchmark_filter=decode_token: 28.7-39.2 GB/s, bf16's 26-34 in the same runs, where the quad kernel read
// 16.7-25.3; int8's 27-29 against the word-pair kernel's 17.5-21). The integer sums are exact, acc = 256 * code.high +
// low.code - zero * sum q = q . (code - zero) over at most 512 inputs (4-bit) or 256 (8-bit: |acc| <= 256 * 32767 * 255
// < 2^31; the partial sums wrap and come back), and each lane's sum is its row's whole, so the f32 steps are one
// multiply-add a row and flush (the quad kernel's four lanes a row are summed at the end); within the same bound
// (kRowQuantized in the tests). MAPPED (MXFP4): one byte shuffle a nibble vector makes each code the unsigned
// byte code_value[c] + 12 (at most 24: the bound holds), and the zero point is 12.
constexpr int kLaneRows = 2;

template <int MR, int BITS, bool MAPPED = false>
TP_AVX512_VNNI void lane_tile(const QuantizedLinear::State& s, const Rows& x, int64_t j, const float* bias, float* c) {
  using State = QuantizedLinear::State;
  constexpr int64_t kPanel = State::kLanePanel, kStepBytes = State::kLaneStepBytes;
  constexpr int64_t kStepInputs = 32 / BITS, kFlushInputs = BITS == 4 ? 512 : 256;
  const int64_t k = s.k, chunks = s.chunks32;
  const uint8_t* panel = s.codes.data() + j / kPanel * s.lane_panel_bytes;
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i mapped = _mm512_setzero_si512();  // MAPPED: each code's byte in every 128-bit lane
  if constexpr (MAPPED) {
    alignas(16) uint8_t mapped_bytes[16];
    for (int v = 0; v < 16; ++v) mapped_bytes[v] = static_cast<uint8_t>(s.code_value[v] + State::kMappedOffset);
    mapped = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(mapped_bytes)));
  }
  __m512 total[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) total[i][q] = _mm512_setzero_ps();
  const size_t runs = s.run_group.size();
  for (size_t run = 0; run < runs; ++run) {
    const uint8_t* params = panel + s.lane_run_offset[run];
    const int64_t p0 = s.run_start[run], p1 = s.run_start[run + 1];
    for (int64_t f0 = p0; f0 < p1; f0 += kFlushInputs) {
      const int64_t f1 = std::min(p1, f0 + kFlushInputs);
      __m512i high_sum[MR][4], low_sum[MR][4];
      for (int i = 0; i < MR; ++i)
        for (int q = 0; q < 4; ++q) high_sum[i][q] = low_sum[i][q] = _mm512_setzero_si512();
      const uint8_t* step = params + s.lane_param_bytes + (f0 - p0) / kStepInputs * kStepBytes;
      for (int64_t p = f0; p < f1; p += kStepInputs, step += kStepBytes) {
        constexpr int kHalves = BITS == 4 ? 2 : 1;  // x's split bytes of each 4 inputs of the step
        __m512i high[MR][kHalves], low[MR][kHalves];
#pragma GCC unroll 2
        for (int i = 0; i < MR; ++i)
          for (int h = 0; h < kHalves; ++h) {  // broadcasts from memory, not through general registers
            high[i][h] = _mm512_broadcastd_epi32(_mm_loadu_si32(x.high + i * k + p + 4 * h));
            low[i][h] = _mm512_broadcastd_epi32(_mm_loadu_si32(x.low + i * k + p + 4 * h));
          }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {  // rows 16q ..< 16q + 16
          if constexpr (BITS == 4) {
            __m512i code[2];  // inputs p ..< p + 4, then p + 4 ..< p + 8
            load_codes(step + 64 * q, code);
            if constexpr (MAPPED)
              for (int h = 0; h < 2; ++h) code[h] = _mm512_shuffle_epi8(mapped, code[h]);
#pragma GCC unroll 2
            for (int i = 0; i < MR; ++i) byte_products(code, high[i], low[i], high_sum[i][q], low_sum[i][q]);
          } else {
            prefetch_codes(step + 64 * q);
            const __m512i code = _mm512_load_si512(step + 64 * q), signed_code = _mm512_xor_si512(code, sign);
#pragma GCC unroll 2
            for (int i = 0; i < MR; ++i) {
              high_sum[i][q] = _mm512_dpbusd_epi32(high_sum[i][q], code, high[i][0]);
              low_sum[i][q] = _mm512_dpbusd_epi32(low_sum[i][q], low[i][0], signed_code);
            }
          }
        }
      }
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const __m512 scale = s.lane_scale_bytes == 2
                                 ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(params + 32 * q)))
                                 : _mm512_load_ps(reinterpret_cast<const float*>(params) + 16 * q);
        const __m512i zero = MAPPED ? _mm512_set1_epi32(State::kMappedOffset)
                                    : _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(
                                          params + kPanel * s.lane_scale_bytes + 16 * q)));
#pragma GCC unroll 2
        for (int i = 0; i < MR; ++i) {
          const int64_t* prefix = x.prefix + i * (chunks + 1);
          const __m512i run_sum = _mm512_set1_epi32(static_cast<int32_t>(prefix[f1 / 32] - prefix[f0 / 32]));
          __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(high_sum[i][q], 8), low_sum[i][q]),
                                         _mm512_mullo_epi32(zero, run_sum));
          if constexpr (BITS == 8) {
            const int64_t* low_prefix = x.low_prefix + i * (chunks + 1);
            sum = _mm512_add_epi32(
                sum, _mm512_set1_epi32(static_cast<int32_t>(128 * (low_prefix[f1 / 32] - low_prefix[f0 / 32]))));
          }
          total[i][q] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, _mm512_set1_ps(x.q_scale[i])), total[i][q]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) {
      const __m512 out = bias != nullptr ? _mm512_add_ps(total[i][q], _mm512_loadu_ps(bias + j + 16 * q)) : total[i][q];
      _mm512_storeu_ps(c + i * s.n + j + 16 * q, out);
    }
}

// x's 16-bit rows as the byte kernel reads them (Rows::low, high, prefix; low_prefix where low_sums: only the
// 8-bit lane kernel reads it).
TP_AVX512_VNNI void split_rows(const int16_t* q, int64_t m, int64_t k, uint8_t* low, int8_t* high, int64_t* prefix,
                               int64_t* low_prefix, bool low_sums) {
  const int64_t chunks = k / 32;
  const __m512i ones = _mm512_set1_epi16(1), low_byte = _mm512_set1_epi16(0xFF);
  for (int64_t i = 0; i < m; ++i) {
    int64_t sum = 0, low_sum = 0;
    prefix[i * (chunks + 1)] = low_prefix[i * (chunks + 1)] = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t p = i * k + 32 * ch;
      const __m512i v = _mm512_loadu_si512(q + p);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + p), _mm512_cvtepi16_epi8(v));  // the low bytes
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(high + p), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
      sum += _mm512_reduce_add_epi32(_mm512_madd_epi16(v, ones));
      prefix[i * (chunks + 1) + ch + 1] = sum;
      if (!low_sums) continue;
      low_sum += _mm512_reduce_add_epi32(_mm512_madd_epi16(_mm512_and_si512(v, low_byte), ones));
      low_prefix[i * (chunks + 1) + ch + 1] = low_sum;
    }
  }
}

// Rows r ..< r + rows of x as the kernels read them.
Rows rows_from(const Rows& x, const QuantizedLinear::State& s, int64_t r) {
  Rows part = x;
  part.a += r * s.k;
  if (x.q != nullptr) {
    part.q += r * s.k;
    part.q_scale += r;
  }
  if (x.low != nullptr) {
    part.low += r * s.k;
    part.high += r * s.k;
    part.prefix += r * (s.chunks32 + 1);
    part.low_prefix += r * (s.chunks32 + 1);
  }
  return part;
}

// Decode's product of m rows (at most kMaxDecodeRows): the tiles take kFusedRows rows of x at a time, and each
// block of W's rows meets every such block of x before the next W block is read, so W is read from memory once
// (the later passes over a block find it in L2: 48 rows of 4096 4-bit inputs are 96 KiB).
constexpr int64_t kMaxDecodeRows = 16;
std::atomic<int64_t> decode_rows_run{0}, prefill_rows_run{0};  // detail::quantized_rows_so_far

void fused_product(const QuantizedLinear::State& s, int64_t m, const float* a, const float* bias, float* c) {
  decode_rows_run.fetch_add(m, std::memory_order_relaxed);
  const detail::QuantizedKernel kernel = detail::quantized_decode_kernel(std::min<int64_t>(m, kFusedRows));
  Rows x{a, nullptr, nullptr};
  thread_local std::vector<int16_t> quantized;
  float q_scale[kMaxDecodeRows];
  if (kernel == detail::QuantizedKernel::Avx512Vnni) {
    quantized.resize(static_cast<size_t>(m * s.k));
    quantize_rows(a, m, s.k, quantized.data(), q_scale);
    x.q = quantized.data();
    x.q_scale = q_scale;
  }
  const bool bytes = kernel == detail::QuantizedKernel::Avx512Vnni && (byte_kernel_fits(s) || s.lanes);
  if (bytes) {
    thread_local std::vector<uint8_t> low;
    thread_local std::vector<int8_t> high;
    thread_local std::vector<int64_t> prefix, low_prefix;
    low.resize(static_cast<size_t>(m * s.k));
    high.resize(static_cast<size_t>(m * s.k));
    prefix.resize(static_cast<size_t>(m * (s.chunks32 + 1)));
    low_prefix.resize(prefix.size());
    split_rows(x.q, m, s.k, low.data(), high.data(), prefix.data(), low_prefix.data(), s.lanes && s.bits == 8);
    x.low = low.data();
    x.high = high.data();
    x.prefix = prefix.data();
    x.low_prefix = low_prefix.data();
  }
  if (bytes && s.lanes) {  // panels of 64 rows split over the threads; each streams its panel once
    const int64_t panels = s.n / QuantizedLinear::State::kLanePanel;
    parallel_for(panels, panels > 1 && s.n * s.k >= (int64_t{1} << 16), [&](int64_t b) {
      for (int64_t r = 0; r < m; r += kLaneRows) {
        const Rows xr = rows_from(x, s, r);
        const int64_t j = b * QuantizedLinear::State::kLanePanel;
        const bool pair = m - r >= 2;
        if (s.mapped)
          (pair ? lane_tile<2, 4, true> : lane_tile<1, 4, true>)(s, xr, j, bias, c + r * s.n);
        else if (s.bits == 4)
          (pair ? lane_tile<2, 4> : lane_tile<1, 4>)(s, xr, j, bias, c + r * s.n);
        else
          (pair ? lane_tile<2, 8> : lane_tile<1, 8>)(s, xr, j, bias, c + r * s.n);
      }
    });
    return;
  }
  // Blocks of W's rows split over the threads; each streams its rows once.
  constexpr int64_t kBlock = 48;
  const int64_t blocks = (s.n + kBlock - 1) / kBlock;
  parallel_for(blocks, blocks > 1 && s.n * s.k >= (int64_t{1} << 16), [&](int64_t b) {
    const int64_t j1 = std::min(s.n, (b + 1) * kBlock);
    for (int64_t r = 0; r < m; r += kFusedRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kFusedRows, m - r));
      const Rows xr = rows_from(x, s, r);
      float* cr = c + r * s.n;
      int64_t j = b * kBlock;
      if (bytes) {
        const int quads = kDotQuadCols[mr - 1];
        for (; j + 3 < j1; j += 4 * quads) {
          const int here = static_cast<int>(std::min<int64_t>(quads, (j1 - j) / 4));
          dot_quad_tile_for(mr, here)(s, xr, j, bias, cr);
          if (here < quads) j -= 4 * (quads - here);  // the last quads of the block
        }
      }
      if (kernel != detail::QuantizedKernel::Avx2) {
        const bool dot = kernel == detail::QuantizedKernel::Avx512Vnni;
        const int pairs = (dot ? kDotPairCols : kPairCols)[mr - 1];
        for (; j + 1 < j1; j += 2 * pairs) {
          const int here = static_cast<int>(std::min<int64_t>(pairs, (j1 - j) / 2));
          (dot ? dot_pair_tile_for(s.bits, mr, here) : pair_tile_for(mr, here))(s, xr, j, bias, cr);
          if (here < pairs) j -= 2 * (pairs - here);  // the last pairs of the block
        }
      }
      const int cols = kFusedCols[mr - 1];
      for (; j < j1; j += cols)
        fused_tile_for(mr, static_cast<int>(std::min<int64_t>(cols, j1 - j)))(s, xr, j, bias, cr);
    }
  });
}

// Prefill (more rows than the decode kernels take): W dequantized by every thread into a reused buffer (the
// largest layer's size in the compute dtype), then the GEMM a PackedLinear of the compute dtype runs (oneDNN's,
// or ordered_gemm where inference products run it). f32: over W's f32 values, as exact as the decode kernels;
// bf16 (a bf16 model's Linears): x and W's values rounded to bf16, the arithmetic of every bf16 Linear, at the
// bf16 GEMM's rate (twice f32's where the CPU has AVX512-BF16). Dequantizing is one pass over the codes per
// call against the product's 2 m N K flops (measured: 0.9x a bf16 PackedLinear's rate at 512 rows).
// (Panels of W's rows, to stay in cache, changed oneDNN's bits with the panel's size and were no faster.)
// W dequantized whole, in run order, into a buffer reused by every call on this thread (the largest layer's
// size): f32 values, or for bf16 arithmetic those values rounded to bf16; rows `*ld` elements apart (the stride
// the GEMMs run fastest at).
const void* dequantized_weight(const QuantizedLinear::State& s, DType compute, int64_t* ld) {
  const bool bf16_math = compute == DType::BF16;
  const size_t esize = bf16_math ? 2 : 4;
  *ld = detail::unconflicted_row_stride(s.k, esize);
  const int64_t stride = *ld;
  thread_local std::shared_ptr<Storage> buffer;
  const size_t bytes = static_cast<size_t>(s.n * stride) * esize;
  if (!buffer || buffer->bytes() < bytes) buffer = Storage::allocate(bytes);
  void* const w = buffer->data();  // (the threads below see their own thread_local, not this one)
  constexpr int64_t kRows = 8;
  const int64_t blocks = (s.n + kRows - 1) / kRows;
  parallel_for(blocks, blocks > 1, [&](int64_t b) {
    const int64_t r0 = b * kRows, r1 = std::min(s.n, r0 + kRows);
    if (bf16_math)
      s.dequantize_rows_bf16(r0, r1, static_cast<bf16*>(w) + r0 * stride, stride);
    else
      s.dequantize_rows(r0, r1, static_cast<float*>(w) + r0 * stride, stride);
  });
  return w;
}

// a as the GEMM's left operand in `compute`'s arithmetic: as is, or rounded to bf16 into a scratch buffer.
const void* gemm_operand(const float* a, int64_t count, DType compute) {
  if (compute != DType::BF16) return a;
  bf16* rounded = detail::bf16_scratch(static_cast<size_t>(count));
  detail::to_bf16_parallel(a, rounded, static_cast<size_t>(count));
  return rounded;
}

// Prefill (more rows than the decode kernels take): W dequantized (dequantized_weight), then the GEMM a
// PackedLinear of the compute dtype runs (oneDNN's, or ordered_gemm where inference products run it). f32: over
// W's f32 values, as exact as the decode kernels; bf16 (a bf16 model's Linears): x and W's values rounded to
// bf16, the arithmetic of every bf16 Linear, at the bf16 GEMM's rate (twice f32's where the CPU has
// AVX512-BF16). Dequantizing is one pass over the codes per call against the product's 2 m N K flops
// (measured: 0.9x a bf16 PackedLinear's rate at 512 rows). (Panels of W's rows, to stay in cache, changed
// oneDNN's bits with the panel's size and were no faster.)
void prefill_product(const QuantizedLinear::State& s, int64_t m, const float* a, const float* bias, float* c,
                     DType compute) {
  prefill_rows_run.fetch_add(m, std::memory_order_relaxed);
  const DType dtype = compute == DType::BF16 ? DType::BF16 : DType::F32;
  int64_t ld = 0;
  const void* w = dequantized_weight(s, dtype, &ld);
  const void* x = gemm_operand(a, m * s.k, dtype);
  if (detail::ordered_gemm_wanted()) {
    detail::ordered_gemm(m, s.n, s.k, x, dtype, s.k, w, dtype, ld, bias, c, s.n);
    return;
  }
  detail::GemmSpec spec;
  spec.m = m;
  spec.n = s.n;
  spec.k = s.k;
  spec.trans_b = true;
  spec.a_dtype = spec.b_dtype = dtype;
  spec.ldb = ld;
  detail::gemm(spec, x, w, bias, c);
}

// dx [m, k] = dy [m, n] . W [n, k] (the backward of a frozen quantized weight), over the same dequantized W in
// the same arithmetic as the forward; under act-order the inputs come back from run order to the checkpoint's.
void input_grad_cpu(const QuantizedLinear::State& s, const Tensor& g, DType compute, const Tensor& dx) {
  const int64_t m = s.n == 0 ? 0 : g.numel() / s.n;
  if (m == 0 || s.k == 0) return;
  const DType dtype = compute == DType::BF16 ? DType::BF16 : DType::F32;
  int64_t ld = 0;
  const void* w = dequantized_weight(s, dtype, &ld);
  detail::GemmSpec spec;
  spec.m = m;
  spec.n = s.k;
  spec.k = s.n;
  spec.a_dtype = spec.b_dtype = dtype;
  spec.ldb = ld;
  if (s.perm.empty()) {
    detail::gemm(spec, gemm_operand(g.data<float>(), m * s.n, dtype), w, nullptr, dx.data<float>());
    return;
  }
  std::vector<float> run_order(static_cast<size_t>(m * s.k));
  detail::gemm(spec, gemm_operand(g.data<float>(), m * s.n, dtype), w, nullptr, run_order.data());
  float* out = dx.data<float>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < s.k; ++p) out[i * s.k + s.perm[static_cast<size_t>(p)]] = run_order[i * s.k + p];
}

// Decode rows however many: fused_product kMaxDecodeRows at a time (one row's bits do not depend on the rows
// beside it).
void decode_product(const QuantizedLinear::State& s, int64_t m, const float* a, const float* bias, float* c) {
  for (int64_t r = 0; r < m; r += kMaxDecodeRows)
    fused_product(s, std::min<int64_t>(kMaxDecodeRows, m - r), a + r * s.k, bias, c + r * s.n);
}

// Prompt rows however many: prefill_product over at least kPromptRows rows (zeros below them), since oneDNN runs
// fewer rows in another order (measured, f32 over 3072 to 14336 inputs: 1-15 rows differ from 16, and 16-80
// agree): a row's bits would depend on how many prompt rows share its step.
constexpr int64_t kPromptRows = 16;
void prompt_product(const QuantizedLinear::State& s, int64_t m, const float* a, const float* bias, float* c,
                    DType compute) {
  if (m >= kPromptRows) return prefill_product(s, m, a, bias, c, compute);
  thread_local std::vector<float> x_padded, y_padded;
  x_padded.assign(static_cast<size_t>(kPromptRows * s.k), 0.f);
  y_padded.resize(static_cast<size_t>(kPromptRows * s.n));
  std::copy_n(a, m * s.k, x_padded.data());
  prefill_product(s, kPromptRows, x_padded.data(), bias, y_padded.data(), compute);
  std::copy_n(y_padded.data(), m * s.n, c);
}

// The rows `decode_rows` flags through decode_product, the others through prompt_product (gathered, computed,
// scattered back; a product of one kind runs in place).
void mixed_product(const QuantizedLinear::State& s, int64_t m, const float* a, const float* bias, float* c,
                   DType compute, std::span<const uint8_t> decode_rows) {
  const auto decodes = static_cast<int64_t>(std::count_if(decode_rows.begin(), decode_rows.end(),
                                                          [](uint8_t d) { return d != 0; }));
  if (decodes == m) return decode_product(s, m, a, bias, c);
  if (decodes == 0) return prompt_product(s, m, a, bias, c, compute);
  thread_local std::vector<float> x_kind, y_kind;
  x_kind.resize(static_cast<size_t>(m * s.k));
  y_kind.resize(static_cast<size_t>(m * s.n));
  for (const bool decode : {true, false}) {
    int64_t rows = 0;
    for (int64_t i = 0; i < m; ++i)
      if ((decode_rows[static_cast<size_t>(i)] != 0) == decode)
        std::copy_n(a + i * s.k, s.k, x_kind.data() + (rows++) * s.k);
    if (decode)
      decode_product(s, rows, x_kind.data(), bias, y_kind.data());
    else
      prompt_product(s, rows, x_kind.data(), bias, y_kind.data(), compute);
    rows = 0;
    for (int64_t i = 0; i < m; ++i)
      if ((decode_rows[static_cast<size_t>(i)] != 0) == decode)
        std::copy_n(y_kind.data() + (rows++) * s.n, s.n, c + i * s.n);
  }
}

// Decode's fused kernels for a few rows, prefill's dequantize-and-GEMM for more, or each row by its kind where
// `decode_rows` says; under act-order x's inputs are first put in run order.
void forward_cpu(const QuantizedLinear::State& s, const Tensor& x, const Tensor& bias, DType compute,
                 std::span<const uint8_t> decode_rows, const Tensor& out) {
  const int64_t m = s.k == 0 ? 0 : x.numel() / s.k;
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
  if (!decode_rows.empty()) return mixed_product(s, m, a, bias_ptr, out.data<float>(), compute, decode_rows);
  if (m <= kFusedRows) {
    fused_product(s, m, a, bias_ptr, out.data<float>());
    return;
  }
  prefill_product(s, m, a, bias_ptr, out.data<float>(), compute);
}

// W's values in run order, then its columns back in the checkpoint's order.
void dequantize_cpu(const QuantizedLinear::State& s, const Tensor& out) {
  if (s.perm.empty()) {
    s.dequantize_rows(0, s.n, out.data<float>());
    return;
  }
  Tensor run_order = Tensor::empty({s.n, s.k});
  s.dequantize_rows(0, s.n, run_order.data<float>());
  const float* src = run_order.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t p = 0; p < s.k; ++p) dst[r * s.k + s.perm[static_cast<size_t>(p)]] = src[r * s.k + p];
}

constexpr QuantizedLinearKernels kCpuQuantizedLinearKernels{forward_cpu, input_grad_cpu, dequantize_cpu};

}  // namespace

KernelTable<QuantizedLinearKernels>& quantized_linear_kernels() {
  static KernelTable<QuantizedLinearKernels> table("quantized_linear", &kCpuQuantizedLinearKernels);
  return table;
}

namespace detail {

QuantizedRows quantized_rows_so_far() {
  return {decode_rows_run.load(std::memory_order_relaxed), prefill_rows_run.load(std::memory_order_relaxed)};
}

QuantizedKernel quantized_decode_kernel(int64_t rows) {
  static const QuantizedKernel kernel = [] {
    const QuantizedKernel best = avx512_vnni_available() && !ordered_gemm_wanted() ? QuantizedKernel::Avx512Vnni
                                 : avx512_available()                                ? QuantizedKernel::Avx512
                                                                                     : QuantizedKernel::Avx2;
    const char* env = std::getenv("TP_QUANTIZED_ISA");
    if (env == nullptr || *env == 0) return best;
    const std::string v(env);
    TP_CHECK(v == "avx2" || v == "avx512" || v == "avx512vnni",
             "TP_QUANTIZED_ISA='{}' is not one of avx2, avx512, avx512vnni", v);
    const QuantizedKernel want = v == "avx2" ? QuantizedKernel::Avx2
                                 : v == "avx512" ? QuantizedKernel::Avx512 : QuantizedKernel::Avx512Vnni;
    TP_CHECK(want == QuantizedKernel::Avx2 || (want == QuantizedKernel::Avx512 ? avx512_available()
                                                                                : avx512_vnni_available()),
             "TP_QUANTIZED_ISA={}: this CPU does not have it", v);
    return want;
  }();
  return rows <= kDotRows || kernel != QuantizedKernel::Avx512Vnni ? kernel : QuantizedKernel::Avx512;
}

}  // namespace detail

float QuantizedLinear::State::value(int64_t row, int64_t p) const {
  const int64_t g = group_at(p);
  const int c = code(row, p);
  return scale(row, g) * static_cast<float>((mapped ? code_value[static_cast<size_t>(c)] : c) - zero(row, g));
}

void QuantizedLinear::State::dequantize_rows(int64_t j0, int64_t j1, float* out, int64_t ld) const {
  if (lanes) return dequantize_lane_rows(j0, j1, out, ld ? ld : k);
  const int64_t chunks = static_cast<int64_t>(chunk_group.size());
  for (int64_t j = j0; j < j1; ++j) {
    float* dst = out + (j - j0) * (ld ? ld : k);
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t g = chunk_group[c];
      if (g < 0) {
        for (int64_t p = 32 * c; p < std::min(k, 32 * c + 32); ++p) dst[p] = value(j, p);
        continue;
      }
      __m256 v[4];
      chunk_values(*this, chunk(j, c), _mm256_set1_epi32(zero(j, g)), _mm256_set1_ps(scale(j, g)), v);
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + 32 * c + 8 * i, v[i]);
    }
  }
}

// Each row's word of a step holds its codes of the step: 4-bit ones, inputs 8t ..< 8t + 4 in the bytes' low
// nibbles and the next 4 in their high ones; 8-bit ones, inputs 4t ..< 4t + 4 a byte each. The values are
// chunk_values' (scale * (code - zero)), 16 at a time (AVX-512: lane panels exist only where the VNNI kernel
// runs; prefill dequantizes every weight, and 8 at a time this was ~13% of an int4 prefill). A run is whole
// chunks of 32 inputs (lane panels need chunks_whole), so 16 at a time covers it.
__attribute__((target("avx512f"))) void QuantizedLinear::State::dequantize_lane_rows(int64_t j0, int64_t j1,
                                                                                     float* out, int64_t ld) const {
  // 16 inputs are 2 words (4-bit: 8 inputs a word) or 4 (8-bit); each lane shifts its code down.
  const __m512i shifts = bits == 8 ? _mm512_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24)
                                   : _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 0, 8, 16, 24, 4, 12, 20, 28);
  const __m512i mask = _mm512_set1_epi32(bits == 8 ? 255 : 15);
  // Locals, not members, in the loop: its stores may alias them, so they were reloaded (and 16 /
  // lane_step_inputs() divided) every 16 values. That and building the 8-bit words' vector through general
  // registers and the stack made this ~2x (4-bit) and ~3x (8-bit) slower: an expert's [768, 2048] weight took as
  // long to dequantize for its prefill GEMM as the GEMM of 16 rows.
  const bool eight = bits == 8, is_mapped = mapped;
  alignas(64) int32_t mapped_values[16];
  for (int v = 0; v < 16; ++v) mapped_values[v] = code_value[v];
  const __m512i values = _mm512_load_si512(mapped_values);           // mapped codes' values (their zero points are 0)
  const int64_t advance = 16 / lane_step_inputs() * kLaneStepBytes;  // the words of the next 16 inputs
  const size_t runs = run_start.size() - 1;
  for (int64_t j = j0; j < j1; ++j) {
    float* dst = out + (j - j0) * ld;
    for (size_t run = 0; run < runs; ++run) {
      const int32_t g = run_group[run];
      const __m512i zero_point = _mm512_set1_epi32(zero(j, g));
      const __m512 group_scale = _mm512_set1_ps(scale(j, g));
      const uint8_t* word = codes.data() + lane_run_at(j, run) + lane_param_bytes + j % kLanePanel * 4;
      for (int64_t p = run_start[run], end = run_start[run + 1]; p < end; p += 16, word += advance) {
        __m512i words = _mm512_broadcastd_epi32(_mm_loadu_si32(word));  // each word into its lanes
        if (eight) {
          words = _mm512_mask_broadcastd_epi32(words, 0xFFF0, _mm_loadu_si32(word + kLaneStepBytes));
          words = _mm512_mask_broadcastd_epi32(words, 0xFF00, _mm_loadu_si32(word + 2 * kLaneStepBytes));
          words = _mm512_mask_broadcastd_epi32(words, 0xF000, _mm_loadu_si32(word + 3 * kLaneStepBytes));
        } else {
          words = _mm512_mask_broadcastd_epi32(words, 0xFF00, _mm_loadu_si32(word + kLaneStepBytes));
        }
        __m512i code = _mm512_and_si512(_mm512_srlv_epi32(words, shifts), mask);
        if (is_mapped) code = _mm512_permutexvar_epi32(code, values);
        _mm512_storeu_ps(dst + p, _mm512_mul_ps(group_scale, _mm512_cvtepi32_ps(_mm512_sub_epi32(code, zero_point))));
      }
    }
  }
}

void QuantizedLinear::State::dequantize_rows_bf16(int64_t j0, int64_t j1, bf16* out, int64_t ld) const {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(k));
  for (int64_t j = j0; j < j1; ++j) {
    dequantize_rows(j, j + 1, row.data());
    convert_f32_to_bf16(row.data(), out + (j - j0) * ld, static_cast<size_t>(k));
  }
}

QuantizedLinear::QuantizedLinear(int bits, int64_t group_size, const Tensor& codes, const Tensor& scales,
                                 const Tensor& zeros, const Tensor& g_idx)
    : QuantizedLinear(bits, group_size, codes, scales, zeros, g_idx, false) {}

QuantizedLinear::QuantizedLinear(int bits, int64_t group_size, const Tensor& codes, const Tensor& scales,
                                 const Tensor& zeros, const Tensor& g_idx, bool e2m1_codes) {
  TP_CHECK(bits == 4 || bits == 8, "QuantizedLinear: bits must be 4 or 8, got {}", bits);
  TP_CHECK(codes.defined() && codes.dim() == 2 && codes.dtype() == DType::U8,
           "QuantizedLinear: codes must be u8 [out, in], got {} {}", codes.defined() ? dtype_name(codes.dtype()) : "",
           codes.defined() ? shape_str(codes.shape()) : "undefined");
  auto st = std::make_shared<State>();
  if (e2m1_codes) {  // 2 x E2M1: exact small integers; bit 3 is the sign
    st->mapped = true;
    st->code_value = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  }
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
  st->chunks_whole = std::find(st->chunk_group.begin(), st->chunk_group.end(), -1) == st->chunk_group.end();

  const float* s = scales.data<float>();
  bool f16_exact = true;
  for (int64_t i = 0; i < n * groups; ++i) {
    TP_CHECK(std::isfinite(s[i]), "QuantizedLinear: scale [{}, {}] is {}", i / groups, i % groups, s[i]);
    f16_exact = f16_exact && to_f32(to_f16(s[i])) == s[i];
  }
  const uint8_t* z = zeros.data<uint8_t>();
  for (int64_t i = 0; i < n * groups; ++i)
    TP_CHECK(z[i] < limit, "QuantizedLinear: zero point [{}, {}] = {} does not fit in {} bits", i / groups, i % groups,
             z[i], bits);

  // Lane panels where the integer kernels will run them (quantized_decode_kernel is fixed per process).
  st->lay_out_codes();  // chunks32 and the panels' sizes, which x's split rows are counted in either way
  if (st->chunks_whole && n > 0 && n % State::kLanePanel == 0 &&
      detail::quantized_decode_kernel(1) == detail::QuantizedKernel::Avx512Vnni) {
    st->lay_out_lanes(f16_exact);
    st->codes.assign_zeros(static_cast<size_t>(n / State::kLanePanel * st->lane_panel_bytes));
  } else {
    st->codes.assign_zeros(st->code_bytes());
  }
  // Each row's codes in run order, then its whole chunks written at once and its last K % 32 one by one (lane
  // panels: each step's word).
  const uint8_t* c = codes.data<uint8_t>();
  std::vector<uint8_t> run_codes(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* row = c + r * k;
    int largest = 0;
    for (int64_t p = 0; p < k; ++p) {
      run_codes[static_cast<size_t>(p)] = row[order[static_cast<size_t>(p)]];
      largest = std::max<int>(largest, run_codes[static_cast<size_t>(p)]);
    }
    if (largest >= limit)
      for (int64_t p = 0; p < k; ++p)
        TP_CHECK(run_codes[static_cast<size_t>(p)] < limit, "QuantizedLinear: code [{}, {}] = {} does not fit in {} bits",
                 r, order[static_cast<size_t>(p)], run_codes[static_cast<size_t>(p)], bits);
    if (st->lanes) {
      st->set_lane_words(r, run_codes.data());
      continue;
    }
    for (int64_t ch = 0; ch < st->chunks32; ++ch) st->set_chunk(r, ch, run_codes.data() + 32 * ch);
    for (int64_t p = 32 * st->chunks32; p < k; ++p) st->set_code(r, p, run_codes[static_cast<size_t>(p)]);
  }

  if (st->lanes) {
    for (int64_t i = 0; i < n * groups; ++i) st->set_lane_params(i / groups, i % groups, s[i], z[i]);
    state_ = std::move(st);
    return;
  }
  if (f16_exact) {
    st->scales16.assign(st->param_count(), 0);
  } else {
    st->scales32.assign(st->param_count(), 0.f);
  }
  if (!st->mapped) st->zeros.assign(st->param_count(), 0);  // (mapped codes' are all 0: none kept)
  for (int64_t i = 0; i < n * groups; ++i) {
    const size_t at = st->param_at(i / groups, i % groups);
    if (f16_exact)
      st->scales16[at] = to_f16(s[i]).bits;
    else
      st->scales32[at] = s[i];
    if (!st->mapped) st->zeros[at] = z[i];
  }
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

QuantizedLinear QuantizedLinear::e2m1(const Tensor& codes, const Tensor& exponents) {
  TP_CHECK(codes.defined() && codes.dim() == 2 && codes.dtype() == DType::U8 && codes.size(1) % 32 == 0,
           "QuantizedLinear::e2m1: codes must be u8 [out, in] with in a multiple of 32, got {} {}",
           codes.defined() ? dtype_name(codes.dtype()) : "", codes.defined() ? shape_str(codes.shape()) : "undefined");
  const int64_t n = codes.size(0), groups = codes.size(1) / 32;
  TP_CHECK(exponents.dtype() == DType::U8 && exponents.shape() == (Shape{n, groups}),
           "QuantizedLinear::e2m1: exponents must be u8 [{}, {}], got {} {}", n, groups,
           dtype_name(exponents.dtype()), shape_str(exponents.shape()));
  // Values 2 x E2M1 (exact small integers), so the scale is 2^(e - 127) / 2.
  Tensor scales = Tensor::empty({n, groups});
  const uint8_t* e = exponents.data<uint8_t>();
  for (int64_t i = 0; i < n * groups; ++i) scales.data<float>()[i] = std::ldexp(1.f, static_cast<int>(e[i]) - 128);
  return QuantizedLinear(4, 32, codes, scales, Tensor::zeros({n, groups}, DType::U8), Tensor(), /*e2m1_codes=*/true);
}

size_t QuantizedLinear::resident_bytes(int bits, int64_t n, int64_t k, int64_t groups, bool permuted) {
  State s;
  s.bits = bits;
  s.n = n;
  s.k = k;
  s.groups = groups;
  s.lay_out_codes();
  return s.code_bytes() + s.param_count() * 3 + (permuted ? static_cast<size_t>(k) * 4 : 0);
}

Tensor QuantizedLinear::dequantize() const {
  TP_CHECK(defined(), "QuantizedLinear::dequantize: no weight");
  const State& s = *state_;
  Tensor out = Tensor::empty({s.n, s.k});
  quantized_linear_kernels().on(out).dequantize(s, out);
  return out;
}

int64_t QuantizedLinear::decode_rows_limit() const { return defined() && state_->lanes ? 48 : 16; }

Tensor linear(const Tensor& x, const QuantizedLinear& w, const Tensor& b, DType compute,
              std::span<const uint8_t> decode_rows) {
  TP_CHECK(w.defined(), "linear: the quantized weight is not loaded");
  Shape shape = x.shape();
  TP_CHECK(!shape.empty(), "linear: input must have at least one dim");
  shape.back() = w.out_features();
  Tensor out = Tensor::empty(shape);
  linear_into(out, x, w, b, compute, decode_rows);
  if (autograd::needs_grad({x, b})) {
    TP_CHECK(!autograd::needs_grad({b}),
             "linear: the bias of a quantized weight takes no gradient (the quantized layer is frozen: train an "
             "adapter over it)");
    autograd::record("quantized_linear", {x}, {out},
                     [state = w.state_, x_shape = x.shape(), compute](const std::vector<Tensor>& g) {
                       const Tensor dy = g[0].to(DType::F32);
                       Tensor dx = Tensor::zeros(x_shape);
                       quantized_linear_kernels().on(dy, dx).input_grad(*state, dy, compute, dx);
                       return std::vector<Tensor>{dx};
                     });
  }
  return out;
}

void linear_into(Tensor& out, const Tensor& x, const QuantizedLinear& w, const Tensor& b, DType compute,
                 std::span<const uint8_t> decode_rows) {
  TP_CHECK(w.defined(), "linear: the quantized weight is not loaded");
  TP_CHECK(compute == DType::F32 || compute == DType::BF16, "linear: a quantized product computes in f32 or bf16, not {}",
           dtype_name(compute));
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
  TP_CHECK(decode_rows.empty() || static_cast<int64_t>(decode_rows.size()) == m,
           "linear: decode_rows flags {} rows of an input of {}", decode_rows.size(), m);
  quantized_linear_kernels().on(x, bias, out).forward(s, x, bias, compute, decode_rows, out);
}

}  // namespace tp::ops
