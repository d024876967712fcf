// The routers' load-balancing loss (ops::router_load_balancing_loss) against
// Transformers' formula written out, its gradient, and its errors.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_test_util.h"
#include "tp/ops/router_loss.h"

using namespace tp;
using namespace tp::test;

// Transformers' load_balancing_loss_func, written out: softmax over the
// concatenated layers' rows, top-k one-hots, E * sum_e mean(one-hot)_e * mean(p)_e.
TEST(RouterAuxLoss, EqualsTransformersFormulaAndItsGradientChecks) {
  const int64_t E = 6, K = 2;
  Tensor a = Tensor::randn({5, E}, 7), b = Tensor::randn({3, E}, 8);
  double routed[E] = {}, prob[E] = {};
  int64_t rows = 0;
  for (const Tensor& l : {a, b}) {
    std::vector<float> v = l.to_vector();
    for (int64_t n = 0; n < l.size(0); ++n, ++rows) {
      std::vector<double> p(E);
      double z = 0;
      for (int64_t e = 0; e < E; ++e) z += p[e] = std::exp(static_cast<double>(v[n * E + e]));
      for (int64_t e = 0; e < E; ++e) prob[e] += p[e] / z;
      std::vector<int64_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return p[i] > p[j]; });
      for (int64_t k = 0; k < K; ++k) routed[order[k]] += 1;
    }
  }
  double want = 0;
  for (int64_t e = 0; e < E; ++e) want += (routed[e] / rows) * (prob[e] / rows);
  want *= E;
  EXPECT_NEAR(ops::router_load_balancing_loss({a, b}, K).item(), want, 1e-6 * want);
  // Uniform probabilities give K whatever the choice (E * sum_e f_e / E, and the f_e sum to K).
  EXPECT_NEAR(ops::router_load_balancing_loss({Tensor::zeros({4, E})}, K).item(), static_cast<double>(K), 1e-6);

  a.set_requires_grad(true);
  b.set_requires_grad(true);
  // Small steps: a finite difference must not flip a top-k choice (those have no gradient).
  autograd::GradcheckResult r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return ops::router_load_balancing_loss(in, 2); }, {a, b},
      {.eps = 1e-3, .atol = 1e-4, .rtol = 1e-2});
  EXPECT_TRUE(r.ok) << r.message;
  expect_error([&] { ops::router_load_balancing_loss({a, Tensor::zeros({2, E + 1})}, K); }, {"f32 [tokens, 6]"});
  expect_error([&] { ops::router_load_balancing_loss({a}, E + 1); }, {"top_k 7"});
}
