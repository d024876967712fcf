// Elementwise, shape, activation and softmax ops: naive references and gradchecks.
#include <cmath>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/ops/activation.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/shape.h"

using namespace tp;
using namespace tp::test;

namespace {

template <class F>
std::vector<double> apply(const Tensor& x, F f) {
  std::vector<double> out;
  for (float v : x.to_vector()) out.push_back(f(static_cast<double>(v)));
  return out;
}

}  // namespace

TEST(Elementwise, AddMulBroadcastTrailingDims) {
  Tensor a = Tensor::randn({2, 3, 4}, 1), b = Tensor::randn({4}, 2), c = Tensor::randn({3, 4}, 3);
  std::vector<float> av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector();
  std::vector<double> sum_ab, prod_ac;
  for (int i = 0; i < 24; ++i) {
    sum_ab.push_back(av[i] + bv[i % 4]);
    prod_ac.push_back(static_cast<double>(av[i]) * cv[i % 12]);
  }
  EXPECT_TRUE(close(ops::add(a, b), sum_ab, 1e-6));
  EXPECT_TRUE(close(ops::add(b, a), sum_ab, 1e-6));  // either side may be the small one
  EXPECT_TRUE(close(ops::mul(a, c), prod_ac, 1e-6));
  EXPECT_TRUE(close(ops::scale(a, -2.5), apply(a, [](double v) { return -2.5 * v; }), 1e-6));
  double total = 0;
  for (float v : av) total += v;
  EXPECT_NEAR(ops::sum(a).item(), total, 1e-5);
  EXPECT_EQ(ops::sum(a).shape(), Shape{});
  Tensor d = a.clone();
  ops::add_(d, b);
  EXPECT_TRUE(close(d, sum_ab, 1e-6));
  EXPECT_EQ(ops::add(Tensor::zeros({0, 4}), b).shape(), (Shape{0, 4}));
  EXPECT_EQ(ops::sum(Tensor::zeros({0})).item(), 0.0);
}

TEST(Elementwise, Gradcheck) {
  auto add = [](const std::vector<Tensor>& in) { return ops::add(in[0], in[1]); };
  TP_EXPECT_GRADCHECK(add, {param({2, 3}, 1), param({3}, 2)});
  TP_EXPECT_GRADCHECK(add, {param({3}, 1), param({2, 3}, 2)});
  auto mul = [](const std::vector<Tensor>& in) { return ops::mul(in[0], in[1]); };
  TP_EXPECT_GRADCHECK(mul, {param({2, 3}, 3), param({2, 3}, 4)});
  TP_EXPECT_GRADCHECK(mul, {param({4}, 5), param({3, 4}, 6)});
  auto scale = [](const std::vector<Tensor>& in) { return ops::scale(in[0], 0.3); };
  TP_EXPECT_GRADCHECK(scale, {param({5}, 7)});
  auto sum = [](const std::vector<Tensor>& in) { return ops::sum(in[0]); };
  TP_EXPECT_GRADCHECK(sum, {param({2, 2}, 8)});
}

TEST(Elementwise, MismatchErrorsNameBothShapes) {
  expect_error([] { ops::add(Tensor::zeros({2, 3}), Tensor::zeros({2})); }, {"[2, 3]", "[2]"});
  expect_error([] { ops::mul(Tensor::zeros({4}), Tensor::zeros({5})); }, {"[4]", "[5]"});
  expect_error([] { ops::add(Tensor::zeros({2}), Tensor::zeros({2}, DType::I64)); }, {"i64"});
  Tensor small = Tensor::zeros({3});
  expect_error([&] { ops::add_(small, Tensor::zeros({2, 3})); }, {"[3]", "[2, 3]"});
}

TEST(Shape, ForwardMatchesRawAndGradchecks) {
  Tensor x = Tensor::randn({2, 3, 4}, 1);
  EXPECT_TRUE(equal(ops::narrow(x, 1, 1, 2), x.narrow(1, 1, 2)));
  EXPECT_TRUE(equal(ops::transpose(x, 0, 2), x.transpose(0, 2)));
  EXPECT_TRUE(equal(ops::cat({x, x}, -1), tp::cat({x, x}, -1)));
  EXPECT_EQ(ops::reshape(x, {4, -1}).shape(), (Shape{4, 6}));
  auto narrow = [](const std::vector<Tensor>& in) { return ops::narrow(in[0], 1, 1, 2); };
  TP_EXPECT_GRADCHECK(narrow, {param({2, 3, 2}, 2)});
  auto cat = [](const std::vector<Tensor>& in) { return ops::cat({in[0], in[1]}, 1); };
  TP_EXPECT_GRADCHECK(cat, {param({2, 1, 3}, 3), param({2, 2, 3}, 4)});
  auto tr = [](const std::vector<Tensor>& in) { return ops::mul(ops::transpose(in[0], 0, 1), in[1]); };
  TP_EXPECT_GRADCHECK(tr, {param({2, 3}, 5), param({3, 2}, 6)});
  auto rs = [](const std::vector<Tensor>& in) { return ops::mul(ops::reshape(in[0], {3, 2}), in[1]); };
  TP_EXPECT_GRADCHECK(rs, {param({2, 3}, 7), param({3, 2}, 8)});
}

TEST(Shape, ToDtypeConvertsGradBack) {
  Tensor x = Tensor::randn({4}, 1).to(DType::BF16);
  x.set_requires_grad(true);
  Tensor y = ops::to_dtype(x, DType::F32);
  EXPECT_EQ(y.dtype(), DType::F32);
  Tensor loss = ops::sum(ops::scale(y, 3.0));
  autograd::backward(loss);
  EXPECT_EQ(x.grad().dtype(), DType::BF16);
  EXPECT_TRUE(close(x.grad(), std::vector<double>(4, 3.0), 0));
  // Same dtype: a new handle, so x stays a leaf.
  Tensor z = param({2}, 2);
  Tensor w = ops::to_dtype(z, DType::F32);
  EXPECT_FALSE(w.is_same(z));
  autograd::backward(ops::sum(w));
  EXPECT_TRUE(close(z.grad(), std::vector<double>{1, 1}, 0));
}

TEST(Activation, MatchesFormulas) {
  Tensor x = Tensor::randn({3, 7}, 1, 0.f, 3.f);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  EXPECT_TRUE(close(ops::silu(x), apply(x, [&](double v) { return v * sig(v); }), 1e-5, 1e-5));
  EXPECT_TRUE(close(ops::gelu(x), apply(x, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }),
                    1e-5, 1e-5));
  EXPECT_TRUE(close(ops::gelu(x, true), apply(x, [](double v) {
                      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
                    }),
                    1e-5, 1e-5));
  Tensor b = Tensor::randn({3, 7}, 2);
  std::vector<double> sw;
  std::vector<float> xv = x.to_vector(), bv = b.to_vector();
  for (size_t i = 0; i < xv.size(); ++i) sw.push_back(xv[i] * sig(xv[i]) * bv[i]);
  EXPECT_TRUE(close(ops::swiglu(x, b), sw, 1e-5, 1e-5));
  EXPECT_EQ(ops::silu(Tensor::zeros({0, 3})).shape(), (Shape{0, 3}));
  expect_error([&] { ops::swiglu(x, Tensor::zeros({7, 3})); }, {"[3, 7]", "[7, 3]"});
}

TEST(Activation, Gradcheck) {
  auto silu = [](const std::vector<Tensor>& in) { return ops::silu(in[0]); };
  TP_EXPECT_GRADCHECK(silu, {param({2, 5}, 1, 2.f)});
  auto gelu = [](const std::vector<Tensor>& in) { return ops::gelu(in[0]); };
  TP_EXPECT_GRADCHECK(gelu, {param({2, 5}, 2, 2.f)});
  auto gelu_tanh = [](const std::vector<Tensor>& in) { return ops::gelu(in[0], true); };
  TP_EXPECT_GRADCHECK(gelu_tanh, {param({2, 5}, 3, 2.f)});
  auto swiglu = [](const std::vector<Tensor>& in) { return ops::swiglu(in[0], in[1]); };
  TP_EXPECT_GRADCHECK(swiglu, {param({3, 4}, 4), param({3, 4}, 5)});
  auto softcap = [](const std::vector<Tensor>& in) { return ops::softcap(in[0], 1.5); };
  TP_EXPECT_GRADCHECK(softcap, {param({2, 5}, 6, 3.f)});
}

TEST(Softcap, IsCapTimesTanhOfXOverCap) {
  Tensor x = Tensor::randn({4, 6}, 7, 0.f, 10.f);
  EXPECT_TRUE(close(ops::softcap(x, 3.0), apply(x, [](double v) { return 3.0 * std::tanh(v / 3.0); }), 1e-5, 1e-5));
  std::vector<float> y = ops::softcap(x, 3.0).to_vector();
  for (float v : y) EXPECT_LE(std::fabs(v), 3.0f);
  expect_error([&] { ops::softcap(x, 0.0); }, {"softcap", "0"});
}

TEST(Softmax, MatchesNaiveOnEveryDim) {
  Tensor x = Tensor::randn({2, 3, 5}, 1, 0.f, 4.f);
  std::vector<float> xv = x.to_vector();
  for (int64_t dim : {0, 1, 2, -1}) {
    int64_t d = dim < 0 ? dim + 3 : dim;
    Shape s = x.shape();
    int64_t stride = 1;
    for (int64_t i = d + 1; i < 3; ++i) stride *= s[i];
    std::vector<double> want(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      int64_t pos = (static_cast<int64_t>(i) / stride) % s[d];
      int64_t base = static_cast<int64_t>(i) - pos * stride;
      double mx = -1e30, tot = 0;
      for (int64_t j = 0; j < s[d]; ++j) mx = std::max(mx, static_cast<double>(xv[base + j * stride]));
      for (int64_t j = 0; j < s[d]; ++j) tot += std::exp(xv[base + j * stride] - mx);
      want[i] = std::exp(xv[i] - mx) / tot;
    }
    EXPECT_TRUE(close(ops::softmax(x, dim), want, 1e-6, 1e-5)) << "dim " << dim;
  }
  // Huge logits stay finite.
  Tensor big = Tensor::from_vector({1000.f, 1001.f}, {1, 2});
  EXPECT_TRUE(close(ops::softmax(big), std::vector<double>{1 / (1 + std::exp(1.0)), 1 / (1 + std::exp(-1.0))}, 1e-6));
  auto fn = [](const std::vector<Tensor>& in) { return ops::softmax(in[0], 1); };
  TP_EXPECT_GRADCHECK(fn, {param({2, 4, 3}, 2)});
}

TEST(EmptyAndSingleRow, EveryPointwiseOpAcceptsThem) {
  Tensor e = Tensor::zeros({0, 5});
  EXPECT_EQ(ops::softmax(e).shape(), (Shape{0, 5}));
  EXPECT_EQ(ops::gelu(e).shape(), (Shape{0, 5}));
  EXPECT_EQ(ops::swiglu(e, e).shape(), (Shape{0, 5}));
  EXPECT_EQ(ops::mul(e, Tensor::zeros({5})).shape(), (Shape{0, 5}));
  EXPECT_EQ(ops::scale(e, 2.0).shape(), (Shape{0, 5}));
  EXPECT_EQ(ops::cat({e, Tensor::zeros({2, 5})}, 0).shape(), (Shape{2, 5}));
  EXPECT_EQ(ops::narrow(Tensor::zeros({3, 4}), 1, 2, 0).shape(), (Shape{3, 0}));
  EXPECT_EQ(ops::transpose(e, 0, 1).shape(), (Shape{5, 0}));
  // One element: softmax is 1 and its gradient is 0.
  Tensor one = param({1, 1}, 1);
  Tensor y = ops::softmax(one);
  EXPECT_EQ(y.item(), 1.0);
  autograd::backward(y);
  EXPECT_EQ(one.grad().item(), 0.0);
}
