#pragma once
// Helpers for the op tests: closeness with the first bad index, gradcheck assertions,
// and error-message checks.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "tp/autograd/gradcheck.h"
#include "tp/tensor/tensor.h"

namespace tp::test {

inline ::testing::AssertionResult close(const Tensor& got, const std::vector<double>& want, double atol,
                                        double rtol = 0) {
  if (got.numel() != static_cast<int64_t>(want.size()))
    return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.size();
  std::vector<float> g = got.to_vector();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double diff = std::fabs(g[i] - want[i]);
    worst = std::max(worst, diff);
    if (!(diff <= atol + rtol * std::fabs(want[i])))
      return ::testing::AssertionFailure() << "first mismatch at " << i << ": got " << g[i] << ", want " << want[i]
                                           << " (atol " << atol << ", rtol " << rtol << ")";
  }
  return ::testing::AssertionSuccess() << "max diff " << worst;
}

inline ::testing::AssertionResult close(const Tensor& got, const Tensor& want, double atol, double rtol = 0) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  std::vector<float> w = want.to_vector();
  return close(got, std::vector<double>(w.begin(), w.end()), atol, rtol);
}

inline Tensor param(const Shape& shape, uint64_t seed, float std = 1.f) {
  Tensor t = Tensor::randn(shape, seed, 0.f, std);
  t.set_requires_grad(true);
  return t;
}

#define TP_EXPECT_GRADCHECK(fn, ...)                                         \
  do {                                                                       \
    auto r_ = ::tp::autograd::gradcheck(fn, __VA_ARGS__);                    \
    EXPECT_TRUE(r_.ok) << r_.message;                                        \
  } while (0)

// Expects `f` to throw tp::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace tp::test
