// ops::QuantizedLinear: W = scale * (code - zero) per row and group, its products
// the fixed sequence of ordered_gemm over W's f32 values, or (decode's 1-2 rows of
// 4-bit codes where AVX512-BF16 is) within 2^-16 of sum |x w| of the exact product.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "tp/ops/ordered_gemm.h"
#include "tp/ops/quantized_linear.h"
#include "tp/tensor/error.h"

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

// Whether a product of m rows runs the AVX512-BF16 dot-product kernel (else the exact sequence).
bool dot_kernel(int bits, int64_t m) {
  return m <= 4 && ops::detail::quantized_decode_kernel(bits, m) == ops::detail::QuantizedKernel::Avx512Bf16;
}

// |y - x . W| over each output of x [m, k] against the double-precision product, within `tolerance` of
// sum |x w| (the scale of the rounding).
void expect_near_double(const Quantized& q, const Tensor& x, const Tensor& y, double tolerance, const char* what) {
  const int64_t m = x.size(0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < q.n; ++j) {
      double want = 0, magnitude = 0;
      for (int64_t c = 0; c < q.k; ++c) {
        const double t = static_cast<double>(x.data<float>()[i * q.k + c]) * reference_weight(q, j, c);
        want += t;
        magnitude += std::fabs(t);
      }
      ASSERT_NEAR(y.data<float>()[i * q.n + j], want, tolerance * magnitude + 1e-30) << what << " " << i << "," << j;
    }
}

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

// Without act-order the product is ordered_gemm over dequantize(), bit for bit,
// for every row count (decode's one row to prefill's many) and with a bias; where the
// dot-product kernel runs, within 2^-16 of sum |x w| of the exact product instead.
TEST_P(QuantizedShapes, ProductIsOrderedGemmOverTheDequantizedWeight) {
  const Shape3 p = GetParam();
  const Quantized q = random_quantized(p.bits, p.n, p.k, p.group_size, false, 11);
  const ops::QuantizedLinear w = make(q);
  const Tensor dense = w.dequantize();
  const Tensor bias = Tensor::randn({p.n}, 5);
  for (int64_t m : {1, 2, 3, 4, 7, 16, 33}) {
    const Tensor x = Tensor::randn({m, p.k}, 100 + m);
    const Tensor y = ops::linear(x, w, bias);
    std::vector<float> want(static_cast<size_t>(m * p.n));
    ops::detail::ordered_gemm(m, p.n, p.k, x.raw_data(), DType::F32, p.k, dense.raw_data(), DType::F32, p.k,
                              bias.data<float>(), want.data(), p.n);
    if (dot_kernel(p.bits, m)) {
      const Tensor unbiased = ops::linear(x, w);
      expect_near_double(q, x, unbiased, 1.0 / 65536, "dot-product kernel");
      for (int64_t i = 0; i < m * p.n; ++i)  // the bias is added once, last
        ASSERT_EQ(y.data<float>()[i], unbiased.data<float>()[i] + bias.data<float>()[i % p.n]) << i;
      continue;
    }
    for (int64_t i = 0; i < m * p.n; ++i) ASSERT_EQ(y.data<float>()[i], want[i]) << "m " << m << " at " << i;
  }
}

// Act-order included: each row's output is the same bits alone and in a batch run
// by the same kind of kernel (2 rows: decode's; 9: prefill's, exact like decode's
// exact kernels), and within f32 rounding of the double-precision product (2^-16 of
// sum |x w| for the dot-product kernel).
TEST_P(QuantizedShapes, RowsAreIndependentAndMatchDouble) {
  const Shape3 p = GetParam();
  for (bool act_order : {false, true}) {
    const Quantized q = random_quantized(p.bits, p.n, p.k, p.group_size, act_order, 13);
    const ops::QuantizedLinear w = make(q);
    for (int64_t m : {2, 9}) {
      const Tensor x = Tensor::randn({m, p.k}, 17);
      const Tensor y = ops::linear(x, w);
      expect_near_double(q, x, y, dot_kernel(p.bits, m) ? 1.0 / 65536 : 1e-6, "batch");
      if (dot_kernel(p.bits, 1) != dot_kernel(p.bits, m)) continue;
      for (int64_t i = 0; i < m; ++i) {
        const Tensor alone = ops::linear(x.narrow(0, i, 1), w);
        for (int64_t j = 0; j < p.n; ++j)
          ASSERT_EQ(alone.data<float>()[j], y.data<float>()[i * p.n + j]) << "m " << m << ": " << i << "," << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizedShapes,
                         ::testing::Values(Shape3{4, 40, 256, 128}, Shape3{4, 13, 100, 32}, Shape3{8, 40, 256, 64},
                                           Shape3{8, 7, 37, 16}, Shape3{4, 30, 96, 96}, Shape3{4, 5, 23, 8}));

// Where the CPU has AVX512-BF16, decode's 4-bit products run the dot-product kernel (so the tests above check
// it), unless TP_GEMM=ordered or TP_QUANTIZED_ISA asks for an exact one; 8-bit codes and 3-4 rows never do.
TEST(QuantizedLinear, DecodeRunsTheDotProductKernelWhereAvx512Bf16Is) {
  using ops::detail::QuantizedKernel;
  if (!__builtin_cpu_supports("avx512bf16")) GTEST_SKIP() << "no AVX512-BF16 here: the exact kernels run";
  if (std::getenv("TP_QUANTIZED_ISA") != nullptr || ops::detail::ordered_gemm_wanted())
    GTEST_SKIP() << "TP_QUANTIZED_ISA or TP_GEMM=ordered chose the kernel";
  EXPECT_EQ(ops::detail::quantized_decode_kernel(4, 1), QuantizedKernel::Avx512Bf16);
  EXPECT_EQ(ops::detail::quantized_decode_kernel(4, 2), QuantizedKernel::Avx512Bf16);
  EXPECT_EQ(ops::detail::quantized_decode_kernel(4, 3), QuantizedKernel::Avx512);
  EXPECT_EQ(ops::detail::quantized_decode_kernel(8, 1), QuantizedKernel::Avx512);
}

TEST(QuantizedLinear, HoldsOnlyCodesScalesAndZeros) {
  const Quantized q4 = random_quantized(4, 64, 1024, 128, false, 1);
  // 4-bit codes two a byte; f16 scales and u8 zeros per row and group of 128.
  EXPECT_EQ(make(q4).nbytes(), size_t{64 * 512 + 64 * 8 * 2 + 64 * 8});
  const Quantized q8 = random_quantized(8, 64, 1024, 128, false, 1, /*f16_scales=*/false);
  EXPECT_EQ(make(q8).nbytes(), size_t{64 * 1024 + 64 * 8 * 4 + 64 * 8});  // scales not f16: kept f32
}

// What tp plan reports per rank before reading a weight is what loading holds (f16 scales), for the shapes with
// panel padding (n not a multiple of 8), tails (k not a multiple of 32) and act-order's permutation.
TEST(QuantizedLinear, ResidentBytesAreWhatItHolds) {
  for (const Shape3& s : {Shape3{4, 40, 256, 128}, Shape3{4, 13, 100, 32}, Shape3{8, 7, 37, 16}, Shape3{4, 5, 23, 8}})
    for (bool act : {false, true}) {
      const Quantized q = random_quantized(s.bits, s.n, s.k, s.group_size, act, 7);
      EXPECT_EQ(make(q).nbytes(), ops::QuantizedLinear::resident_bytes(s.bits, s.n, s.k, q.groups, act))
          << s.bits << "-bit [" << s.n << ", " << s.k << "] g" << s.group_size << (act ? " act-order" : "");
    }
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
