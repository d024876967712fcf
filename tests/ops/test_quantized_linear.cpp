// ops::QuantizedLinear: W = scale * (code - zero) per row and group. Decode's products
// (1-4 rows) are the fixed sequence of ordered_gemm over W's f32 values, or (where
// AVX512-VNNI is) within half a step of x quantized per row to 16 bits, times sum |w|;
// prefill's are the GEMM over dequantize(), in f32 or in bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tp/autograd/tape.h"
#include "tp/ops/gemm.h"
#include "tp/ops/ordered_gemm.h"
#include "tp/ops/quantized_linear.h"
#include "tp/core/error.h"

using namespace tp;

namespace {

struct Quantized {
  int bits;
  int64_t n, k, group_size, groups;
  Tensor codes, scales, zeros, g_idx;
};

// Random codes, zeros and scales; `act_order`: a g_idx that puts the inputs of each
// group anywhere (each group holds group_size of them, as GPTQ's desc_act does).
Quantized random_quantized(int bits, int64_t n, int64_t k, int64_t group_size, bool act_order, uint64_t seed,
                           bool f16_scales = true) {
  std::mt19937_64 rng(seed);
  const int64_t groups = (k + group_size - 1) / group_size;
  Quantized q{bits, n, k, group_size, groups, Tensor::empty({n, k}, DType::U8), Tensor::empty({n, groups}),
              Tensor::empty({n, groups}, DType::U8), Tensor()};
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (int64_t i = 0; i < n * k; ++i) q.codes.data<uint8_t>()[i] = static_cast<uint8_t>(code(rng));
  for (int64_t i = 0; i < n * groups; ++i) {
    const float s = scale(rng);
    q.scales.data<float>()[i] = f16_scales ? to_f32(to_f16(s)) : s;
    q.zeros.data<uint8_t>()[i] = static_cast<uint8_t>(code(rng));
  }
  if (act_order) {
    std::vector<int32_t> order(static_cast<size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    q.g_idx = Tensor::empty({k}, DType::I32);
    for (int64_t i = 0; i < k; ++i) q.g_idx.data<int32_t>()[order[i]] = static_cast<int32_t>(i / group_size);
  }
  return q;
}

ops::QuantizedLinear make(const Quantized& q) {
  return ops::QuantizedLinear(q.bits, q.group_size, q.codes, q.scales, q.zeros, q.g_idx);
}

// W[r, c] from the definition, in double, then rounded once to f32.
float reference_weight(const Quantized& q, int64_t r, int64_t c) {
  const int64_t g = q.g_idx.defined() ? q.g_idx.data<int32_t>()[c] : c / q.group_size;
  const double s = q.scales.data<float>()[r * q.groups + g];
  const int z = q.zeros.data<uint8_t>()[r * q.groups + g];
  return static_cast<float>(s * (q.codes.data<uint8_t>()[r * q.k + c] - z));
}

// Whether a product of m rows runs the AVX512-VNNI integer kernel (else the exact sequence).
bool dot_kernel(int64_t m) {
  return m <= 4 && ops::detail::quantized_decode_kernel(m) == ops::detail::QuantizedKernel::Avx512Vnni;
}

// What more rows than decode's get: the GEMM a PackedLinear runs (oneDNN's, or ordered_gemm where inference
// products run it) over `dense` (W in run order) laid out at the row stride GEMMs run fastest at, under
// `compute` (bf16: x and W rounded to bf16 first).
std::vector<float> prefill_reference(const Tensor& x, const Tensor& dense, const Tensor& bias, DType compute) {
  const int64_t m = x.size(0), n = dense.size(0), k = dense.size(1);
  const Tensor a = compute == DType::BF16 ? x.to(DType::BF16) : x;
  const int64_t ld = ops::detail::unconflicted_row_stride(k, dtype_size(compute));
  const Tensor values = compute == DType::BF16 ? dense.to(DType::BF16) : dense;
  const size_t esize = dtype_size(compute);
  Tensor w = Tensor::zeros({n, ld}, compute);
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(static_cast<char*>(w.raw_data()) + r * ld * esize,
                static_cast<const char*>(values.raw_data()) + r * k * esize, k * esize);
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  std::vector<float> c(static_cast<size_t>(m * n));
  if (ops::detail::ordered_gemm_wanted()) {
    ops::detail::ordered_gemm(m, n, k, a.raw_data(), compute, k, w.raw_data(), compute, ld, b, c.data(), n);
    return c;
  }
  ops::detail::GemmSpec spec;
  spec.m = m;
  spec.n = n;
  spec.k = k;
  spec.trans_b = true;
  spec.a_dtype = spec.b_dtype = compute;
  spec.ldb = ld;
  ops::detail::gemm(spec, a.raw_data(), w.raw_data(), b, c.data());
  return c;
}

// |y - x . W| over each output of x [m, k] against the double-precision product, within `tolerance` of
// sum |x w| (the scale of f32's and bf16's rounding), or with `per_row_x`, within tolerance of
// max |x of the row| * sum |w| (the scale of x quantized per row) plus 2^-20 of sum |x w|.
void expect_near_double(const Quantized& q, const Tensor& x, const Tensor& y, double tolerance, const char* what,
                        bool per_row_x = false) {
  const int64_t m = x.size(0);
  for (int64_t i = 0; i < m; ++i) {
    double x_max = 0;
    for (int64_t c = 0; c < q.k; ++c) x_max = std::max(x_max, std::fabs(double{x.data<float>()[i * q.k + c]}));
    for (int64_t j = 0; j < q.n; ++j) {
      double want = 0, magnitude = 0, w_sum = 0;
      for (int64_t c = 0; c < q.k; ++c) {
        const double t = static_cast<double>(x.data<float>()[i * q.k + c]) * reference_weight(q, j, c);
        want += t;
        magnitude += std::fabs(t);
        w_sum += std::fabs(reference_weight(q, j, c));
      }
      const double bound = per_row_x ? tolerance * x_max * w_sum + magnitude / (1 << 20) : tolerance * magnitude;
      ASSERT_NEAR(y.data<float>()[i * q.n + j], want, bound + 1e-30) << what << " " << i << "," << j;
    }
  }
}

// The integer kernel's bound: x quantized to 16 bits a row, half a step of max |x| / 32767.
constexpr double kRowQuantized = 0.5 / 32767;

struct Shape3 {
  int bits;
  int64_t n, k, group_size;
};

class QuantizedShapes : public ::testing::TestWithParam<Shape3> {};

TEST_P(QuantizedShapes, DequantizeIsTheDefinition) {
  const Shape3 p = GetParam();
  for (bool act_order : {false, true}) {
    const Quantized q = random_quantized(p.bits, p.n, p.k, p.group_size, act_order, 7);
    const Tensor w = make(q).dequantize();
    ASSERT_EQ(w.shape(), (Shape{p.n, p.k}));
    for (int64_t r = 0; r < p.n; ++r)
      for (int64_t c = 0; c < p.k; ++c)
        ASSERT_EQ(w.data<float>()[r * p.k + c], reference_weight(q, r, c)) << r << "," << c << " act " << act_order;
  }
}

// Without act-order decode's product (1-4 rows) is ordered_gemm over dequantize(), bit for bit, with a bias
// too (where the integer kernel runs: within its bound, kRowQuantized), and prefill's (more
// rows) the GEMM over dequantize() in f32 and in bf16, bit for bit; bf16 is within 2^-8 of sum |x w| (x and W
// each rounded once to 8 bits).
TEST_P(QuantizedShapes, ProductIsTheGemmOverTheDequantizedWeight) {
  const Shape3 p = GetParam();
  const Quantized q = random_quantized(p.bits, p.n, p.k, p.group_size, false, 11);
  const ops::QuantizedLinear w = make(q);
  const Tensor dense = w.dequantize();
  const Tensor bias = Tensor::randn({p.n}, 5);
  for (int64_t m : {1, 2, 3, 4, 7, 16, 33}) {
    const Tensor x = Tensor::randn({m, p.k}, 100 + m);
    if (m > 4) {
      for (DType compute : {DType::F32, DType::BF16}) {
        const Tensor y = ops::linear(x, w, bias, compute);
        const std::vector<float> want = prefill_reference(x, dense, bias, compute);
        for (int64_t i = 0; i < m * p.n; ++i)
          ASSERT_EQ(y.data<float>()[i], want[i]) << "m " << m << " " << dtype_name(compute) << " at " << i;
      }
      expect_near_double(q, x, ops::linear(x, w, Tensor(), DType::BF16), 1.0 / 256, "bf16 prefill");
      continue;
    }
    const Tensor y = ops::linear(x, w, bias);
    EXPECT_TRUE(equal(y, ops::linear(x, w, bias, DType::BF16))) << "decode computes in f32 either way";
    std::vector<float> want(static_cast<size_t>(m * p.n));
    ops::detail::ordered_gemm(m, p.n, p.k, x.raw_data(), DType::F32, p.k, dense.raw_data(), DType::F32, p.k,
                              bias.data<float>(), want.data(), p.n);
    if (dot_kernel(m)) {
      const Tensor unbiased = ops::linear(x, w);
      expect_near_double(q, x, unbiased, kRowQuantized, "integer kernel", true);
      for (int64_t i = 0; i < m * p.n; ++i)  // the bias is added once, last
        ASSERT_EQ(y.data<float>()[i], unbiased.data<float>()[i] + bias.data<float>()[i % p.n]) << i;
      continue;
    }
    for (int64_t i = 0; i < m * p.n; ++i) ASSERT_EQ(y.data<float>()[i], want[i]) << "m " << m << " at " << i;
  }
}

// Act-order included: each row's output is the same bits alone and in a batch run by the same kind of kernel
// (decode's 1-2 rows; prefill's 5 and 9), and within f32 rounding of the double-precision product (the
// integer kernel: within its bound).
TEST_P(QuantizedShapes, RowsAreIndependentAndMatchDouble) {
  const Shape3 p = GetParam();
  for (bool act_order : {false, true}) {
    const Quantized q = random_quantized(p.bits, p.n, p.k, p.group_size, act_order, 13);
    const ops::QuantizedLinear w = make(q);
    for (int64_t m : {2, 9}) {
      const Tensor x = Tensor::randn({m, p.k}, 17);
      const Tensor y = ops::linear(x, w);
      if (dot_kernel(m))
        expect_near_double(q, x, y, kRowQuantized, "batch", true);
      else
        expect_near_double(q, x, y, 1e-6, "batch");
      // Alone: one row where decode's kernel runs both; else in batches of 5 (the first five rows, the last five).
      const int64_t alone = m <= 4 ? 1 : 5;
      if (m <= 4 && dot_kernel(1) != dot_kernel(m)) continue;
      for (int64_t start : {int64_t{0}, m - alone}) {
        const Tensor part = ops::linear(x.narrow(0, start, alone), w);
        for (int64_t i = start; i < start + alone; ++i)
          for (int64_t j = 0; j < p.n; ++j)
            ASSERT_EQ(part.data<float>()[(i - start) * p.n + j], y.data<float>()[i * p.n + j])
                << "m " << m << ": " << i << "," << j;
      }
    }
  }
}

// With decode_rows, each row takes its kind's kernel however many rows share the product: a flagged row has the
// bits it gets alone in a one-row product, the others the bits they get alone in prefill's (f32 and bf16; in f32
// over 6144 inputs oneDNN's order for under 16 rows differs), in every interleaving, act-order included.
// (Without the flags 6 rows would all run prefill's.)
TEST_P(QuantizedShapes, DecodeRowsTakeDecodesKernelsWhateverTheirNumber) {
  const Shape3 p = GetParam();
  for (bool act_order : {false, true}) {
    const Quantized q = random_quantized(p.bits, p.n, p.k, p.group_size, act_order, 19);
    const ops::QuantizedLinear w = make(q);
    const Tensor bias = Tensor::randn({p.n}, 21);
    for (int64_t m : {6, 13, 16, 21}) {  // 21: a sweep of 16 rows, then one of 5
      const Tensor x = Tensor::randn({m, p.k}, 23 + m);
      for (const int every : {1, 3, 0}) {  // every row a decode, two rows of three, none
        std::vector<uint8_t> flags(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i) flags[static_cast<size_t>(i)] = every != 0 && i % 3 < (every == 1 ? 3 : 2);
        for (DType compute : {DType::F32, DType::BF16}) {
          const Tensor y = ops::linear(x, w, bias, compute, flags);
          for (int64_t i = 0; i < m; ++i) {
            const uint8_t kind = flags[static_cast<size_t>(i)];
            const Tensor alone = ops::linear(x.narrow(0, i, 1), w, bias, compute, std::vector<uint8_t>{kind});
            if (kind != 0) {  // decode's kernel: the bits of a one-row product without flags
              EXPECT_TRUE(equal(alone, ops::linear(x.narrow(0, i, 1), w, bias, compute)));
            }
            for (int64_t j = 0; j < p.n; ++j)
              ASSERT_EQ(y.data<float>()[i * p.n + j], alone.data<float>()[j])
                  << "m " << m << " row " << i << (kind ? " (decode)" : " (prompt)") << " col " << j << " "
                  << dtype_name(compute) << " act " << act_order;
          }
        }
      }
    }
    EXPECT_THROW(ops::linear(Tensor::randn({3, p.k}, 1), w, Tensor(), DType::F32, std::vector<uint8_t>{1, 0}), Error);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizedShapes,
                         ::testing::Values(Shape3{4, 40, 256, 128}, Shape3{4, 13, 100, 32}, Shape3{8, 40, 256, 64},
                                           Shape3{8, 7, 37, 16}, Shape3{4, 30, 96, 96}, Shape3{4, 5, 23, 8},
                                           // rows padded for the GEMM (6144 inputs)
                                           Shape3{4, 150, 6144, 128}, Shape3{8, 150, 6144, 64},
                                           // one group longer than the integer kernel's 16-chunk runs
                                           Shape3{8, 24, 2048, 2048}, Shape3{4, 20, 1088, 1088},
                                           // rows a multiple of 64: the integer kernels' lane panels
                                           Shape3{4, 128, 256, 32}, Shape3{4, 64, 1088, 1088}, Shape3{8, 128, 256, 64},
                                           Shape3{8, 64, 1088, 1088}));

// Where the CPU has AVX512-VNNI, decode's products (1-4 rows) run the integer kernel (so the tests above check
// it), unless TP_GEMM=ordered or TP_QUANTIZED_ISA asks for an exact one; prefill's never do.
TEST(QuantizedLinear, DecodeRunsTheIntegerKernelWhereAvx512VnniIs) {
  using ops::detail::QuantizedKernel;
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw"))
    GTEST_SKIP() << "no AVX512-VNNI here: the exact kernels run";
  if (std::getenv("TP_QUANTIZED_ISA") != nullptr || ops::detail::ordered_gemm_wanted())
    GTEST_SKIP() << "TP_QUANTIZED_ISA or TP_GEMM=ordered chose the kernel";
  for (int64_t rows = 1; rows <= 4; ++rows)
    EXPECT_EQ(ops::detail::quantized_decode_kernel(rows), QuantizedKernel::Avx512Vnni) << rows;
  EXPECT_EQ(ops::detail::quantized_decode_kernel(5), QuantizedKernel::Avx512);
}

// A row of zeros (scale 0) and rows with one large value (most of the row a few steps of 16 bits) in the
// integer kernels (24 rows: 8-bit codes by word products, 4-bit ones by byte products in three quads; 64 rows:
// both by byte products in lane panels, x split into bytes):
// still within their bound, and zeros give the bias alone.
TEST(QuantizedLinear, IntegerKernelKeepsItsBoundOnOutliersAndZeros) {
  for (int bits : {8, 4})
    for (int64_t n : {24, 64}) {  // 64: lane panels
      const Quantized q = random_quantized(bits, n, 256, 64, false, 21);
      const ops::QuantizedLinear w = make(q);
      Tensor x = Tensor::randn({3, 256}, 23);
      for (int64_t c = 0; c < 256; ++c) x.data<float>()[c] = 0.f;
      x.data<float>()[256 + 7] = 1000.f;
      x.data<float>()[512 + 255] = -3e4f;
      const Tensor bias = Tensor::randn({n}, 3);
      const Tensor y = ops::linear(x, w, bias);
      for (int64_t j = 0; j < n; ++j) EXPECT_EQ(y.data<float>()[j], bias.data<float>()[j]) << bits << " bits, " << j;
      expect_near_double(q, x.narrow(0, 1, 2), ops::linear(x.narrow(0, 1, 2), w), dot_kernel(2) ? kRowQuantized : 1e-6,
                         bits == 8 ? "outliers, 8 bits" : "outliers, 4 bits", dot_kernel(2));
    }
}

TEST(QuantizedLinear, HoldsOnlyCodesScalesAndZeros) {
  const Quantized q4 = random_quantized(4, 64, 1024, 128, false, 1);
  // 4-bit codes two a byte; f16 scales and u8 zeros per row and group of 128.
  EXPECT_EQ(make(q4).nbytes(), size_t{64 * 512 + 64 * 8 * 2 + 64 * 8});
  const Quantized q8 = random_quantized(8, 64, 1024, 128, false, 1, /*f16_scales=*/false);
  EXPECT_EQ(make(q8).nbytes(), size_t{64 * 1024 + 64 * 8 * 4 + 64 * 8});  // scales not f16: kept f32
  const Quantized q4f = random_quantized(4, 64, 1024, 128, false, 1, /*f16_scales=*/false);
  EXPECT_EQ(make(q4f).nbytes(), size_t{64 * 512 + 64 * 8 * 4 + 64 * 8});
}

// Scales that are not f16 values kept as f32, in the integer kernels' lane panels too (64 rows, 4- and 8-bit codes):
// dequantize() is the definition and one and two rows of x within the integer kernel's bound, act-order included.
TEST(QuantizedLinear, F32ScalesKeepTheirValues) {
  for (bool act_order : {false, true})
    for (int bits : {4, 8}) {
      const Quantized q = random_quantized(bits, 64, 256, 64, act_order, 9, /*f16_scales=*/false);
      const ops::QuantizedLinear w = make(q);
      const Tensor dense = w.dequantize();
      for (int64_t r = 0; r < q.n; ++r)
        for (int64_t c = 0; c < q.k; ++c) ASSERT_EQ(dense.data<float>()[r * q.k + c], reference_weight(q, r, c));
      const Tensor x = Tensor::randn({2, q.k}, 4);
      expect_near_double(q, x, ops::linear(x, w), dot_kernel(2) ? kRowQuantized : 1e-6, "f32 scales", dot_kernel(2));
    }
}

// What tp plan reports per rank before reading a weight is what loading holds (f16 scales), for the shapes with
// panel padding (n not a multiple of 8), tails (k not a multiple of 32), act-order's permutation and lane panels
// (rows a multiple of 64, where the integer kernels run).
TEST(QuantizedLinear, ResidentBytesAreWhatItHolds) {
  for (const Shape3& s : {Shape3{4, 40, 256, 128}, Shape3{4, 13, 100, 32}, Shape3{8, 7, 37, 16}, Shape3{4, 5, 23, 8},
                          Shape3{4, 64, 256, 32}, Shape3{8, 128, 256, 64}})
    for (bool act : {false, true}) {
      const Quantized q = random_quantized(s.bits, s.n, s.k, s.group_size, act, 7);
      EXPECT_EQ(make(q).nbytes(), ops::QuantizedLinear::resident_bytes(s.bits, s.n, s.k, q.groups, act))
          << s.bits << "-bit [" << s.n << ", " << s.k << "] g" << s.group_size << (act ? " act-order" : "");
    }
}

// A frozen quantized weight under LoRA (QLoRA): x's gradient is dy . W over the weight's values, computed in
// double here from the definition (act-order's inputs back in the checkpoint's order), within f32 rounding (bf16
// arithmetic: within 2^-8 of sum |dy w|, dy and W each rounded once); W and its bias take none, and a bias that
// asks for one is refused.
TEST(QuantizedLinear, InputGradientIsDyTimesTheWeight) {
  for (bool act_order : {false, true})
    for (int bits : {4, 8})
      for (DType compute : {DType::F32, DType::BF16}) {
        const Quantized q = random_quantized(bits, 40, 96, 32, act_order, 31);
        const ops::QuantizedLinear w = make(q);
        Tensor x = Tensor::randn({2, 3, q.k}, 7);
        x.set_requires_grad(true);
        const Tensor y = ops::linear(x, w, Tensor(), compute);
        ASSERT_EQ(y.shape(), (Shape{2, 3, q.n}));
        const Tensor dy = Tensor::randn(y.shape(), 8);
        autograd::backward(y, dy);
        ASSERT_TRUE(x.grad().defined());
        ASSERT_EQ(x.grad().shape(), x.shape());
        const double tolerance = compute == DType::BF16 ? 1.0 / 256 : 1e-6;
        for (int64_t i = 0; i < 6; ++i)
          for (int64_t c = 0; c < q.k; ++c) {
            double want = 0, magnitude = 0;
            for (int64_t j = 0; j < q.n; ++j) {
              const double t = static_cast<double>(dy.data<float>()[i * q.n + j]) * reference_weight(q, j, c);
              want += t;
              magnitude += std::fabs(t);
            }
            ASSERT_NEAR(x.grad().data<float>()[i * q.k + c], want, tolerance * magnitude)
                << bits << "-bit, act-order " << act_order << ", " << dtype_name(compute) << " at " << i << "," << c;
          }
      }
  const Quantized q = random_quantized(4, 8, 64, 32, false, 5);
  Tensor bias = Tensor::randn({8}, 1);
  bias.set_requires_grad(true);
  EXPECT_THROW(ops::linear(Tensor::randn({2, 64}, 2), make(q), bias), Error);
}

// MXFP4 (GPT-OSS's experts): E2M1 codes (bit 3 the sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}) times
// 2^(e - 127) per block of 32 inputs. dequantize() is that definition exactly; products are within each kernel's
// bound of the double-precision product (the integer kernel where decode runs it, f32 rounding elsewhere), with
// and without a bias; it holds codes and f16 scales only. 24 rows: the pair kernels' panels; 64 (where AVX512-VNNI
// is): the integer kernels' lane panels, each code made its value by a byte shuffle.
TEST(QuantizedLinear, E2m1CodesAreMxfp4Values) {
  constexpr double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (const int64_t n : {24, 64}) {
    const int64_t k = 96, blocks = k / 32;
    std::mt19937_64 rng(41 + n);
    Tensor codes = Tensor::empty({n, k}, DType::U8), exponents = Tensor::empty({n, blocks}, DType::U8);
    for (int64_t i = 0; i < n * k; ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 16);
    for (int64_t i = 0; i < n * blocks; ++i) exponents.data<uint8_t>()[i] = static_cast<uint8_t>(118 + rng() % 12);
    auto weight = [&](int64_t r, int64_t c) {
      const uint8_t code = codes.data<uint8_t>()[r * k + c];
      const double v = kE2m1[code & 7] * std::ldexp(1.0, exponents.data<uint8_t>()[r * blocks + c / 32] - 127);
      return code & 8 ? -v : v;
    };
    const ops::QuantizedLinear w = ops::QuantizedLinear::e2m1(codes, exponents);
    EXPECT_EQ(w.nbytes(), ops::QuantizedLinear::e2m1_resident_bytes(n, k));
    EXPECT_EQ(w.nbytes(), size_t(n * k / 2 + n * blocks * 2));
    if (n == 64 && ops::detail::quantized_decode_kernel(1) == ops::detail::QuantizedKernel::Avx512Vnni)
      EXPECT_EQ(w.decode_rows_limit(), 48) << "64 rows of MXFP4 codes take the lane panels";
    const Tensor dense = w.dequantize();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(dense.data<float>()[r * k + c], static_cast<float>(weight(r, c))) << n << " rows";
    const Tensor bias = Tensor::randn({n}, 3);
    for (int64_t m : {1, 2, 3, 4, 7, 16}) {
      const Tensor x = Tensor::randn({m, k}, 50 + m);
      const Tensor y = ops::linear(x, w), yb = ops::linear(x, w, bias);
      for (int64_t i = 0; i < m; ++i) {
        double x_max = 0;
        for (int64_t c = 0; c < k; ++c) x_max = std::max(x_max, std::fabs(double{x.data<float>()[i * k + c]}));
        for (int64_t j = 0; j < n; ++j) {
          double want = 0, magnitude = 0, w_sum = 0;
          for (int64_t c = 0; c < k; ++c) {
            want += x.data<float>()[i * k + c] * weight(j, c);
            magnitude += std::fabs(x.data<float>()[i * k + c] * weight(j, c));
            w_sum += std::fabs(weight(j, c));
          }
          const double bound = dot_kernel(m) ? kRowQuantized * x_max * w_sum + magnitude / (1 << 20) : 1e-6 * magnitude;
          ASSERT_NEAR(y.data<float>()[i * n + j], want, bound + 1e-30)
              << n << " rows, m " << m << " at " << i << "," << j;
          ASSERT_NEAR(yb.data<float>()[i * n + j], want + bias.data<float>()[j], bound + 1e-6)
              << n << " rows, bias, m " << m;
        }
      }
    }
  }
  EXPECT_THROW(ops::QuantizedLinear::e2m1(Tensor::zeros({4, 40}, DType::U8), Tensor::zeros({4, 1}, DType::U8)), Error);
  EXPECT_THROW(ops::QuantizedLinear::e2m1(Tensor::zeros({4, 64}, DType::U8), Tensor::zeros({4, 3}, DType::U8)), Error);
}

TEST(QuantizedLinear, RefusesWhatDoesNotFit) {
  Quantized q = random_quantized(4, 4, 32, 16, false, 3);
  q.codes.data<uint8_t>()[5] = 16;
  EXPECT_THROW(
      {
        try {
          make(q);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("code [0, 5] = 16 does not fit in 4 bits"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  q = random_quantized(4, 4, 32, 16, true, 3);
  q.g_idx.data<int32_t>()[3] = 2;
  EXPECT_THROW(make(q), Error);
  q = random_quantized(4, 4, 32, 16, false, 3);
  q.scales.data<float>()[1] = std::nanf("");
  EXPECT_THROW(make(q), Error);
  q = random_quantized(4, 4, 32, 16, false, 3);
  EXPECT_THROW(ops::QuantizedLinear(3, 16, q.codes, q.scales, q.zeros), Error);
  EXPECT_THROW(ops::linear(Tensor::randn({2, 31}, 1), make(q)), Error);
}

}  // namespace
