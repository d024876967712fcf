// ops::detail::ordered_gemm: every output is the header's fixed sequence over K, so
// its bits do not depend on the rows, columns or threads around it.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tp/ops/ordered_gemm.h"
#include "tp/tensor/tensor.h"

using namespace tp;

namespace {

struct Problem {
  int64_t m, n, k;
  DType dtype;        // W's
  Tensor a, w, bias;  // a [m, k] f32 or bf16, w [n, k], bias [n]
};

Problem problem(int64_t m, int64_t n, int64_t k, DType dtype, uint64_t seed, DType a_dtype = DType::F32) {
  return {m, n, k, dtype, Tensor::randn({m, k}, seed, 0.f, 1.f, a_dtype),
          Tensor::randn({n, k}, seed + 1, 0.f, 0.1f, dtype), Tensor::randn({n}, seed + 2)};
}

// A's value as the product reads it: bf16 arithmetic when either operand is bf16.
float a_value(const Problem& p, int64_t i, int64_t q) {
  if (p.a.dtype() == DType::BF16) return to_f32(p.a.data<bf16>()[i * p.k + q]);
  const float v = p.a.data<float>()[i * p.k + q];
  return p.dtype == DType::BF16 ? to_f32(to_bf16(v)) : v;
}

float w_value(const Problem& p, int64_t j, int64_t q) {
  return p.dtype == DType::BF16 ? to_f32(p.w.data<bf16>()[j * p.k + q]) : p.w.data<float>()[j * p.k + q];
}

// The order ordered_gemm.h documents, one output at a time, written out plainly.
float documented(const Problem& p, int64_t i, int64_t j, bool with_bias) {
  float s[8] = {};
  const int64_t k8 = p.k / 8 * 8;
  for (int64_t q = 0; q < k8; ++q) s[q % 8] = std::fma(a_value(p, i, q), w_value(p, j, q), s[q % 8]);
  float total = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  for (int64_t q = k8; q < p.k; ++q) total = std::fma(a_value(p, i, q), w_value(p, j, q), total);
  return with_bias ? total + p.bias.data<float>()[j] : total;
}

// C for rows [i0, i0 + m) and columns [j0, j0 + n) of the problem, computed on their own.
std::vector<float> window(const Problem& p, int64_t i0, int64_t m, int64_t j0, int64_t n, bool with_bias) {
  std::vector<float> c(static_cast<size_t>(m * n), NAN);
  const size_t w_size = dtype_size(p.dtype), a_size = dtype_size(p.a.dtype());
  ops::detail::ordered_gemm(m, n, p.k, static_cast<const char*>(p.a.raw_data()) + i0 * p.k * a_size, p.a.dtype(), p.k,
                            static_cast<const char*>(p.w.raw_data()) + j0 * p.k * w_size, p.dtype, p.k,
                            with_bias ? p.bias.data<float>() + j0 : nullptr, c.data(), n);
  return c;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST(OrderedGemm, EveryOutputIsTheDocumentedSequence) {
  for (auto [dtype, a_dtype] : {std::pair{DType::F32, DType::F32}, {DType::BF16, DType::F32},
                                {DType::F32, DType::BF16}, {DType::BF16, DType::BF16}})
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {1, 13, 7}, {2, 25, 8}, {3, 12, 33},
                           {7, 50, 1000}, {16, 100, 72}, {5, 13, 3001}})
      for (bool with_bias : {false, true}) {
        Problem p = problem(m, n, k, dtype, 10 + m + n, a_dtype);
        std::vector<float> c = window(p, 0, m, 0, n, with_bias);
        int wrong = 0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) wrong += !same_bits(c[i * n + j], documented(p, i, j, with_bias));
        EXPECT_EQ(wrong, 0) << "W " << dtype_name(dtype) << " A " << dtype_name(a_dtype) << " m " << m << " n " << n << " k " << k << " bias " << with_bias;
      }
}

TEST(OrderedGemm, BitsDoNotDependOnRowsColumnsOrThreads) {
  const int threads = omp_get_max_threads();
  for (DType dtype : {DType::F32, DType::BF16}) {
    // Large enough to run threaded and over several column blocks (~256 KiB of W each).
    Problem p = problem(20, 700, 1030, dtype, 3);
    const std::vector<float> full = window(p, 0, p.m, 0, p.n, true);
    omp_set_num_threads(1);
    EXPECT_EQ(window(p, 0, p.m, 0, p.n, true), full) << "one thread";
    omp_set_num_threads(threads);
    for (auto [i0, m] : {std::pair<int64_t, int64_t>{0, 1}, {5, 1}, {19, 1}, {2, 3}, {4, 9}})
      for (auto [j0, n] : {std::pair<int64_t, int64_t>{0, 700}, {1, 24}, {37, 5}, {600, 100}, {699, 1}}) {
        const std::vector<float> part = window(p, i0, m, j0, n, true);
        int wrong = 0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) wrong += !same_bits(part[i * n + j], full[(i0 + i) * p.n + j0 + j]);
        EXPECT_EQ(wrong, 0) << dtype_name(dtype) << " rows " << i0 << "+" << m << " columns " << j0 << "+" << n;
      }
  }
}

TEST(OrderedGemm, CloseToTheExactProduct) {
  Problem p = problem(5, 33, 4099, DType::BF16, 7);
  std::vector<float> c = window(p, 0, p.m, 0, p.n, true);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double exact = p.bias.data<float>()[j], mag = std::fabs(exact);
      for (int64_t q = 0; q < p.k; ++q) {
        const double t = static_cast<double>(a_value(p, i, q)) * w_value(p, j, q);
        exact += t;
        mag += std::fabs(t);
      }
      EXPECT_NEAR(c[i * p.n + j], exact, 1e-6 * mag) << i << "," << j;
    }
}

TEST(OrderedGemm, EmptyReductionIsTheBias) {
  Problem p = problem(2, 3, 0, DType::F32, 1);
  std::vector<float> c = window(p, 0, 2, 0, 3, true);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(c[i * 3 + j], p.bias.data<float>()[j]);
}
