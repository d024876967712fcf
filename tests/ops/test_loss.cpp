#include <cmath>

#include "op_test_util.h"
#include "tp/ops/loss.h"

using namespace tp;
using namespace tp::test;

TEST(CrossEntropy, MatchesNaiveWithIgnoreIndex) {
  Tensor logits = Tensor::randn({4, 5}, 1, 0.f, 3.f);
  Tensor targets = Tensor::from_ints({2, -100, 0, 4}, {4});
  std::vector<float> x = logits.to_vector();
  double total = 0;
  int count = 0;
  for (int i = 0; i < 4; ++i) {
    int64_t t = targets.to_int_vector()[i];
    if (t == -100) continue;
    double s = 0;
    for (int j = 0; j < 5; ++j) s += std::exp(static_cast<double>(x[i * 5 + j]));
    total += std::log(s) - x[i * 5 + t];
    ++count;
  }
  EXPECT_NEAR(ops::cross_entropy(logits, targets).item(), total / count, 1e-5);
  EXPECT_EQ(ops::cross_entropy(logits, Tensor::full({4}, -1, DType::I64), -1).item(), 0.0);
  EXPECT_EQ(ops::cross_entropy(Tensor::zeros({0, 5}), Tensor::zeros({0}, DType::I64)).item(), 0.0);
  auto fn = [targets](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], targets); };
  TP_EXPECT_GRADCHECK(fn, {param({4, 5}, 2)});
}

TEST(CrossEntropy, BadTargetsAndShapesAreErrors) {
  Tensor logits = Tensor::zeros({2, 3});
  expect_error([&] { ops::cross_entropy(logits, Tensor::from_ints({0, 3}, {2})); }, {"3", "[0, 3)"});
  expect_error([&] { ops::cross_entropy(logits, Tensor::from_ints({0}, {1})); }, {"[2, 3]", "[1]"});
}
