// Tape basics, exercised through real ops: accumulation across backward calls,
// NoGradGuard, a diamond graph, and backward through the shape ops.
#include <gtest/gtest.h>

#include "tp/autograd/tape.h"
#include "tp/ops/ops.h"

using namespace tp;

namespace {

Tensor leaf(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::from_vector(v, s);
  t.set_requires_grad(true);
  return t;
}

std::vector<float> grad_of(const Tensor& t) { return t.grad().to_vector(); }

}  // namespace

TEST(Tape, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 2, 3}, {3});
  autograd::backward(ops::sum(ops::scale(x, 2.0)));
  EXPECT_EQ(grad_of(x), (std::vector<float>{2, 2, 2}));
  autograd::backward(ops::sum(ops::mul(x, x)));  // d/dx x^2 = 2x, added
  EXPECT_EQ(grad_of(x), (std::vector<float>{4, 6, 8}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(autograd::tape_size(), 0u);  // backward clears the tape
}

TEST(Tape, SharedGradientsDoNotAlias) {
  // add hands the same gradient to both inputs; accumulating into one must not change the other.
  Tensor a = leaf({1, 1}, {2}), b = leaf({1, 1}, {2});
  autograd::backward(ops::sum(ops::add(a, b)));
  autograd::backward(ops::sum(ops::scale(a, 5.0)));
  EXPECT_EQ(grad_of(a), (std::vector<float>{6, 6}));
  EXPECT_EQ(grad_of(b), (std::vector<float>{1, 1}));
}

TEST(Tape, NoGradGuardRecordsNothing) {
  Tensor x = leaf({1, 2}, {2});
  autograd::clear_tape();
  {
    autograd::NoGradGuard guard;
    EXPECT_FALSE(autograd::is_grad_enabled());
    Tensor y = ops::silu(ops::add(ops::mul(x, x), x));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(autograd::tape_size(), 0u);
  }
  EXPECT_TRUE(autograd::is_grad_enabled());
  ops::mul(x, x);
  EXPECT_EQ(autograd::tape_size(), 1u);
  autograd::clear_tape();
}

TEST(Tape, DiamondGraphSumsBothPaths) {
  // y = x*x + silu(x)... simpler closed form: y = sum(3x + x*x), x used on three paths.
  Tensor x = leaf({1, -2, 0.5}, {3});
  Tensor a = ops::scale(x, 3.0);
  Tensor b = ops::mul(x, x);
  autograd::backward(ops::sum(ops::add(a, b)));
  EXPECT_EQ(grad_of(x), (std::vector<float>{3 + 2, 3 - 4, 3 + 1}));
}

TEST(Tape, BackwardThroughReshapeNarrowCat) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = leaf({10, 20}, {2, 1});
  // z = cat([narrow(x, 1, 1, 2), y], 1) -> [2, 3]; reshape to [6]; weight by 1..6.
  Tensor z = ops::reshape(ops::cat({ops::narrow(x, 1, 1, 2), y}, 1), {6});
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {6});
  autograd::backward(ops::sum(ops::mul(z, w)));
  // z = [x01, x02, y0, x11, x12, y1] weighted by 1..6.
  EXPECT_EQ(grad_of(x), (std::vector<float>{0, 1, 2, 0, 4, 5}));
  EXPECT_EQ(grad_of(y), (std::vector<float>{3, 6}));
}

TEST(Tape, BackwardNeedsAGradRoot) {
  Tensor x = Tensor::from_vector({1}, {1});
  EXPECT_THROW(autograd::backward(ops::scale(x, 2.0)), Error);
  Tensor v = leaf({1, 2}, {2});
  EXPECT_THROW(autograd::backward(ops::scale(v, 2.0)), Error);  // two elements need an explicit grad
  autograd::clear_tape();
}
