// How fast can a decode loop stream weights from memory on this core, by what it does per byte and where its
// scales live? Stand-alone loops over one buffer (huge pages, larger than the caches), each round timing every
// loop once, each rate divided by the plain read pass of the same round; medians over the rounds.
//
//   read          4 loads and 4 adds a 256-byte step: the read pass.
//   bf16          the bf16 decode kernel's loop (ops/detail/bf16_gemv.cpp): 64 rows a panel, a step 2 inputs of
//                 each row, 4 loads, one 32-bit broadcast of x and 4 VDPBF16PS.
//   int4_min      4-bit codes, 64 rows a panel with a row in each 32-bit lane (a step 8 inputs of each row:
//                 4 loads, 3 bit operations and 4 VPDPBUSD a load, x split into a signed high and an unsigned
//                 low byte as the 4-bit kernel does), x constant, a group's integer sums added up every 4 KiB
//                 without scales: the least arithmetic an exact 16-bit-x product of 4-bit codes needs.
//   int4_scales   int4_min with x walking (its split bytes broadcast 4 at a time from two arrays) and each
//                 group of 128 inputs' 64 f16 scales from a separate array, as quantized_linear keeps them.
//   int4_inline   the same with each group's scales stored after its 4 KiB of codes, in the one stream.
//   keys_*        decode attention's score arithmetic (ops/vec.cpp's dots_8_keys for a kv group of 2 query heads)
//                 on a bf16 cache read front to back: a key a 256-byte row of 128 elements, each 16 widened
//                 (VPMOVZXWD and a shift) and two FMAs, one for each query row, into 16 chains (2 rows x 8 keys).
//                 keys_l1 runs it over 32 KiB again and again (the arithmetic alone, no memory); keys_none
//                 streams the buffer with no software prefetch, keys_t0 / keys_t1 with each line prefetched
//                 4 KiB ahead into L1 / L2, keys_far 32 KiB ahead into L1 (attention prefetches a block of
//                 16 positions ahead: 32 KiB of qwen3-0.6b's cache). The value pass does the same arithmetic a
//                 byte (a widening and two FMAs each 16 elements), so together they say how fast decode
//                 attention can stream its cache on this core, its reductions and the cache's layout aside.
//
// None of these is a product: the values are not checked. They measure what a layout lets a loop stream.
//   OMP_NUM_THREADS=1 taskset -c 1 build/bench/ops/bench_decode_stream [--rounds 10] [--mib 256] [--k 1024]
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define BENCH_VNNI __attribute__((target("avx512f,avx512bw,avx512bf16,avx512vnni"), noinline))

constexpr int64_t kGroupInputs = 128;
constexpr int64_t kGroupCodeBytes = 64 * kGroupInputs / 2;  // a panel's codes of one group: 4 KiB
constexpr int64_t kGroupScaleBytes = 64 * 2;                // its 64 f16 scales

BENCH_VNNI int read_pass(const uint8_t* w, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 256) {
    a0 = _mm512_add_epi32(a0, _mm512_load_si512(w + i));
    a1 = _mm512_add_epi32(a1, _mm512_load_si512(w + i + 64));
    a2 = _mm512_add_epi32(a2, _mm512_load_si512(w + i + 128));
    a3 = _mm512_add_epi32(a3, _mm512_load_si512(w + i + 192));
  }
  return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
}

BENCH_VNNI float bf16_loop(const uint8_t* w, size_t bytes, const uint32_t* x_pairs, int64_t k) {
  const size_t panel = static_cast<size_t>(64 * k * 2);
  __m512 sink = _mm512_setzero_ps();
  for (size_t off = 0; off + panel <= bytes; off += panel) {
    const __m512i* p = reinterpret_cast<const __m512i*>(w + off);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t s = 0; s < k / 2; ++s) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x_pairs[s]));
      for (int j = 0; j < 4; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_load_si512(p + 4 * s + j), xv);
    }
    sink = _mm512_add_ps(sink, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
  return _mm512_reduce_add_ps(sink);
}

// keys_*: `prefetch` 0 none, 1 into L1 4 KiB ahead, 2 into L2 4 KiB ahead, 3 into L1 32 KiB ahead.
// (noipa: GCC deems a loop that only reads pure, and computed keys_l1's repeated passes over the same bytes once.)
template <int kPrefetch>
__attribute__((noipa)) BENCH_VNNI float keys_loop(const uint8_t* w, size_t bytes, const float* q) {
  constexpr int64_t kKeyBytes = 256, kDims = 128;
  __m512 acc[2][8];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (size_t off = 0; off + 8 * kKeyBytes <= bytes; off += 8 * kKeyBytes) {
#pragma GCC unroll 8
    for (int64_t c = 0; c < kDims; c += 16) {
      const __m512 q0 = _mm512_loadu_ps(q + c), q1 = _mm512_loadu_ps(q + kDims + c);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const uint8_t* at = w + off + j * kKeyBytes + 2 * c;
        if constexpr (kPrefetch != 0)
          if (c % 32 == 0) {
            const char* ahead = reinterpret_cast<const char*>(at + (kPrefetch == 3 ? 32768 : 4096));
            if constexpr (kPrefetch == 2)
              _mm_prefetch(ahead, _MM_HINT_T1);
            else
              _mm_prefetch(ahead, _MM_HINT_T0);
          }
        const __m512 k = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))), 16));
        acc[0][j] = _mm512_fmadd_ps(q0, k, acc[0][j]);
        acc[1][j] = _mm512_fmadd_ps(q1, k, acc[1][j]);
      }
    }
  }
  __m512 total = _mm512_setzero_ps();
  for (auto& row : acc)
    for (auto& a : row) total = _mm512_add_ps(total, a);
  return _mm512_reduce_add_ps(total);
}

enum Int4Form { kMinimal, kSeparateScales, kInlineScales };

// Panels of 64 rows by k inputs, groups of 128 inputs; x's split bytes (high, low) are k long.
template <Int4Form kForm>
BENCH_VNNI float int4_loop(const uint8_t* w, size_t bytes, int64_t k, const int8_t* x_high, const uint8_t* x_low,
                           const uint16_t* scales, size_t scale_groups) {
  const __m512i nibble = _mm512_set1_epi8(15);
  const int64_t group_bytes = kGroupCodeBytes + (kForm == kInlineScales ? kGroupScaleBytes : 0);
  const int64_t groups = k / kGroupInputs;
  const size_t panel = static_cast<size_t>(groups * group_bytes);
  __m512 total = _mm512_setzero_ps();
  __m512i int_total = _mm512_setzero_si512();
  size_t group_index = 0;
  for (size_t off = 0; off + panel <= bytes; off += panel) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t g = 0; g < groups; ++g, ++group_index) {
      const uint8_t* codes = w + off + g * group_bytes;
      __m512i high_sum[4], low_sum[4];
      for (int j = 0; j < 4; ++j) high_sum[j] = low_sum[j] = _mm512_setzero_si512();
      for (int64_t s = 0; s < kGroupInputs / 8; ++s) {
        __m512i h0 = _mm512_set1_epi32(0x01020304), h1 = _mm512_set1_epi32(0x05060708), l0 = h1, l1 = h0;
        if constexpr (kForm != kMinimal) {
          const int64_t p = g * kGroupInputs + 8 * s;
          int32_t v[4];
          std::memcpy(&v[0], x_high + p, 4);
          std::memcpy(&v[1], x_high + p + 4, 4);
          std::memcpy(&v[2], x_low + p, 4);
          std::memcpy(&v[3], x_low + p + 4, 4);
          h0 = _mm512_set1_epi32(v[0]);
          h1 = _mm512_set1_epi32(v[1]);
          l0 = _mm512_set1_epi32(v[2]);
          l1 = _mm512_set1_epi32(v[3]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m512i bytes64 = _mm512_load_si512(codes + 256 * s + 64 * j);
          const __m512i lo = _mm512_and_si512(bytes64, nibble);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes64, 4), nibble);
          high_sum[j] = _mm512_dpbusd_epi32(high_sum[j], lo, h0);
          low_sum[j] = _mm512_dpbusd_epi32(low_sum[j], l0, lo);
          high_sum[j] = _mm512_dpbusd_epi32(high_sum[j], hi, h1);
          low_sum[j] = _mm512_dpbusd_epi32(low_sum[j], l1, hi);
        }
      }
      if constexpr (kForm == kMinimal) {
        for (int j = 0; j < 4; ++j) int_total = _mm512_add_epi32(int_total, _mm512_add_epi32(high_sum[j], low_sum[j]));
      } else {
        const uint16_t* group_scales = kForm == kInlineScales
                                           ? reinterpret_cast<const uint16_t*>(codes + kGroupCodeBytes)
                                           : scales + (group_index % scale_groups) * 64;
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(high_sum[j], 8), low_sum[j]);
          const __m512 scale =
              _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_scales + 16 * j)));
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[j]);
        }
      }
    }
    total = _mm512_add_ps(total, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
  return _mm512_reduce_add_ps(total) + static_cast<float>(_mm512_reduce_add_epi32(int_total));
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
}

int64_t option(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (name == argv[i]) {
      char* end = nullptr;
      const long long v = std::strtoll(argv[i + 1], &end, 10);
      if (end == argv[i + 1] || *end != '\0' || v <= 0) {
        std::fprintf(stderr, "bench_decode_stream: %s takes a positive integer, got '%s'\n", name.c_str(), argv[i + 1]);
        std::exit(2);
      }
      return v;
    }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bf16")) {
    std::fprintf(stderr, "bench_decode_stream: needs AVX512-VNNI and AVX512-BF16, which this CPU lacks\n");
    return 0;
  }
  const int64_t rounds = option(argc, argv, "--rounds", 10);
  const size_t bytes = static_cast<size_t>(option(argc, argv, "--mib", 256)) << 20;
  const int64_t k = option(argc, argv, "--k", 1024);
  if (k % kGroupInputs != 0 || bytes < static_cast<size_t>(64 * k * 2)) {
    std::fprintf(stderr, "bench_decode_stream: --k must be a multiple of %lld and a 64-row panel must fit in --mib\n",
                 static_cast<long long>(kGroupInputs));
    return 2;
  }
  const size_t huge_page = size_t{1} << 21;
  auto* w = static_cast<uint8_t*>(std::aligned_alloc(huge_page, (bytes + huge_page - 1) / huge_page * huge_page));
  madvise(w, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes; ++i) w[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  const std::vector<uint32_t> x_pairs(static_cast<size_t>(k / 2), 0x3f803f80u);
  const std::vector<int8_t> x_high(static_cast<size_t>(k), 3);
  const std::vector<uint8_t> x_low(static_cast<size_t>(k), 200);
  // As many groups' scales as the codes have: a stream from memory, as in a model's token.
  const size_t scale_groups = bytes / kGroupCodeBytes;
  const std::vector<uint16_t> scales(scale_groups * 64, 0x3c00);

  const std::vector<float> q(256, 0.01f);
  constexpr size_t kInL1 = 32 << 10, kL1Passes = 2048;

  constexpr int kLoops = 9;
  const char* names[kLoops] = {"bf16",      "int4_min", "int4_scales", "int4_inline", "keys_l1",
                               "keys_none", "keys_t0",  "keys_t1",     "keys_far"};
  std::vector<double> read_gbs, ratio[kLoops];
  volatile float sink = 0;
  // The bytes a loop over whole panels of `panel` bytes reads.
  auto covered = [&](int64_t panel) { return static_cast<double>(bytes / static_cast<size_t>(panel) * panel); };
  auto rate = [&](double read_bytes, auto&& loop) {
    const double t0 = seconds_now();
    sink = sink + static_cast<float>(loop());
    return read_bytes / (seconds_now() - t0) / 1e9;
  };
  const int64_t groups = k / kGroupInputs;
  for (int64_t r = 0; r < rounds; ++r) {
    const double read = rate(covered(256), [&] { return read_pass(w, bytes); });
    const double got[kLoops] = {
        rate(covered(64 * k * 2), [&] { return bf16_loop(w, bytes, x_pairs.data(), k); }),
        rate(
            covered(groups * kGroupCodeBytes),
            [&] { return int4_loop<kMinimal>(w, bytes, k, x_high.data(), x_low.data(), scales.data(), scale_groups); }),
        // The separate scales are read too: 2 bytes a group and row.
        rate(covered(groups * kGroupCodeBytes) * (kGroupCodeBytes + kGroupScaleBytes) / kGroupCodeBytes,
             [&] {
               return int4_loop<kSeparateScales>(w, bytes, k, x_high.data(), x_low.data(), scales.data(), scale_groups);
             }),
        rate(covered(groups * (kGroupCodeBytes + kGroupScaleBytes)),
             [&] {
               return int4_loop<kInlineScales>(w, bytes, k, x_high.data(), x_low.data(), scales.data(), scale_groups);
             }),
        rate(static_cast<double>(kInL1 * kL1Passes),
             [&] {
               float sum = 0;
               for (size_t i = 0; i < kL1Passes; ++i) sum += keys_loop<0>(w, kInL1, q.data());
               return sum;
             }),
        rate(covered(2048), [&] { return keys_loop<0>(w, bytes, q.data()); }),
        rate(covered(2048), [&] { return keys_loop<1>(w, bytes, q.data()); }),
        rate(covered(2048), [&] { return keys_loop<2>(w, bytes, q.data()); }),
        rate(covered(2048), [&] { return keys_loop<3>(w, bytes, q.data()); })};
    read_gbs.push_back(read);
    std::printf("round %lld: read %.1f GB/s", static_cast<long long>(r), read);
    for (int i = 0; i < kLoops; ++i) {
      ratio[i].push_back(got[i] / read);
      std::printf("  %s %.2f", names[i], got[i] / read);
    }
    std::printf("\n");
  }
  std::printf("{\"k\":%lld,\"mib\":%zu,\"rounds\":%lld,\"read_gbs_median\":%.2f", static_cast<long long>(k),
              bytes >> 20, static_cast<long long>(rounds), median(read_gbs));
  for (int i = 0; i < kLoops; ++i) std::printf(",\"%s_over_read_median\":%.3f", names[i], median(ratio[i]));
  std::printf("}\n");
  std::free(w);
  return 0;
}
