// The ops a training step runs over its parameter slabs: the gradient norm's sum
// of squares, the bf16 compute copies' rounding, and the AdamW / SGD updates.
#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"
#include "tp/ops/bf16_rounding.h"
#include "tp/ops/optimizer_updates.h"
#include "tp/ops/sum_squares.h"
#include "tp/tensor/convert.h"

namespace tp {
namespace {

TEST(SumSquares, AddsEveryBlocksSquaresToTheTotal) {
  // Over three blocks of 64 Ki elements (the last one short) and a tail.
  const int64_t n = (int64_t{1} << 17) + 1000;
  Tensor x = Tensor::randn({n}, 1);
  const std::vector<float> v = x.to_vector();
  double want = 0;
  for (float f : v) want += static_cast<double>(f) * f;
  double total = 1.0;
  ops::accumulate_sum_squares(x, total);
  EXPECT_NEAR(total, 1.0 + want, 1e-9 * want);
  double empty = 2.0;
  ops::accumulate_sum_squares(Tensor::empty({0}), empty);
  EXPECT_EQ(empty, 2.0);
}

TEST(Bf16Rounding, GivesTheBf16ValuesAsBf16OrAsF32) {
  Tensor src = Tensor::randn({3, 70000}, 2);  // over the 64 Ki-element blocks
  Tensor as_bf16 = Tensor::empty(src.shape(), DType::BF16), as_f32 = Tensor::empty(src.shape());
  ops::round_to_bf16(src, as_bf16);
  ops::round_to_bf16(src, as_f32);
  EXPECT_EQ(as_bf16.to_vector(), src.to(DType::BF16).to_vector());
  EXPECT_EQ(as_f32.to_vector(), as_bf16.to_vector());
}

TEST(OptimizerUpdates, AdamWIsTorchsForLoopStep) {
  const int64_t n = 37;  // a vector part and a tail
  Tensor w = Tensor::randn({n}, 3), g = Tensor::randn({n}, 4), m = Tensor::randn({n}, 5),
         v = Tensor::rand({n}, 6, 0.f, 1.f);
  const ops::AdamWScalars c{0.99f, 0.9f, 0.1f, 0.999f, 0.001f, 0.03f, 1e-8f, 0.01f, 0.5f};
  std::vector<float> ws = w.to_vector(), gs = g.to_vector(), ms = m.to_vector(), vs = v.to_vector();
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gs[i] * c.grad_scale;
    ws[i] *= c.keep;
    ms[i] = ms[i] * c.beta1 + c.one_minus_beta1 * gi;
    vs[i] = vs[i] * c.beta2 + c.one_minus_beta2 * gi * gi;
    ws[i] -= c.step_size * ms[i] / (std::sqrt(vs[i]) / c.bias_correction2_sqrt + c.eps);
  }
  ops::adamw_update(c, w, g, m, v);
  // To rounding: the compiler may contract this loop's products and sums.
  auto doubles = [](const std::vector<float>& f) { return std::vector<double>(f.begin(), f.end()); };
  EXPECT_TRUE(test::close(w, doubles(ws), 1e-6, 1e-6));
  EXPECT_TRUE(test::close(m, doubles(ms), 1e-6, 1e-6));
  EXPECT_TRUE(test::close(v, doubles(vs), 1e-6, 1e-6));
}

TEST(OptimizerUpdates, TheNewMastersAreRoundedIntoTheComputeCopy) {
  // Over many blocks of 4096 (split over threads) and a short last one.
  const int64_t n = 20 * 4096 + 100;
  const ops::AdamWScalars c{0.99f, 0.9f, 0.1f, 0.999f, 0.001f, 0.03f, 1e-8f, 0.01f, 1.f};
  for (DType dtype : {DType::BF16, DType::F32}) {
    Tensor w = Tensor::randn({n}, 1), g = Tensor::randn({n}, 2), m = Tensor::zeros({n}), v = Tensor::zeros({n});
    Tensor w_alone = w.clone(), m_alone = m.clone(), v_alone = v.clone(), compute = Tensor::empty({n}, dtype);
    ops::adamw_update(c, w, g, m, v, compute);
    ops::adamw_update(c, w_alone, g, m_alone, v_alone);
    EXPECT_EQ(w.to_vector(), w_alone.to_vector());
    EXPECT_EQ(compute.to_vector(), w.to(DType::BF16).to_vector()) << dtype_name(dtype);
    ops::sgd_update({.rate = 0.1f, .momentum = 0.f, .weight_decay = 0.f, .grad_scale = 1.f, .first = true}, w, g,
                    Tensor(), compute);
    EXPECT_EQ(compute.to_vector(), w.to(DType::BF16).to_vector()) << dtype_name(dtype);
  }
}

TEST(OptimizerUpdates, SgdWithAndWithoutMomentum) {
  const int64_t n = 9;
  Tensor g = Tensor::randn({n}, 7), w0 = Tensor::randn({n}, 8);
  const ops::SgdScalars plain{.rate = 0.1f, .momentum = 0.f, .weight_decay = 0.01f, .grad_scale = 1.f, .first = true};
  Tensor w = w0.clone();
  ops::sgd_update(plain, w, g, Tensor());
  for (int64_t i = 0; i < n; ++i) {
    const float d = static_cast<float>(g.at(i)) + 0.01f * static_cast<float>(w0.at(i));
    EXPECT_NEAR(w.at(i), static_cast<float>(w0.at(i)) - 0.1f * d, 1e-6);
  }
  Tensor b = Tensor::full({n}, 1.0), wm = w0.clone();
  ops::sgd_update({.rate = 0.1f, .momentum = 0.9f, .weight_decay = 0.f, .grad_scale = 1.f, .first = false}, wm, g, b);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(b.at(i), 0.9f * 1.f + static_cast<float>(g.at(i)), 1e-6);
  EXPECT_THROW(ops::sgd_update(plain, w, Tensor::randn({n + 1}, 9), Tensor()), Error);
}

}  // namespace
}  // namespace tp
