// The local phases of the vocab-parallel loss (ops/vocab_parallel_loss.h): over
// two slices of the vocabulary, with the reductions done here as training/loss.cpp
// does them over the group, they give the loss and gradient of the whole rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "op_test_util.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/linear.h"
#include "tp/ops/vocab_parallel_loss.h"

namespace tp {
namespace {

constexpr int64_t kIgnore = -100;

// log(sum_j e^x[r, j]) - x[r, target[r]] summed over the targets, in double.
double direct_loss(const Tensor& logits, const std::vector<int64_t>& target) {
  const int64_t v = logits.size(1);
  const std::vector<float> x = logits.to_vector();
  double total = 0;
  for (size_t r = 0; r < target.size(); ++r) {
    if (target[r] == kIgnore) continue;
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(static_cast<double>(x[r * v + j]));
    total += std::log(s) - x[r * v + target[r]];
  }
  return total;
}

TEST(VocabParallelLoss, TwoSlicesReducedGiveTheWholeRowsLossAndGradient) {
  const int64_t rows = 4, v = 7, split = 3;
  const std::vector<int64_t> ids = {2, kIgnore, 6, 0};
  Tensor logits = Tensor::randn({rows, v}, 1, 0.f, 3.f), target = Tensor::from_ints(ids, {rows});
  Tensor slices[2] = {logits.transpose(0, 1).narrow(0, 0, split).transpose(0, 1),
                      logits.transpose(0, 1).narrow(0, split, v - split).transpose(0, 1)};
  const int64_t starts[2] = {0, split};
  Tensor max[2], sums[2];
  for (int i = 0; i < 2; ++i) {
    max[i] = Tensor::empty({rows});
    ops::loss_row_max(slices[i], max[i]);
  }
  Tensor global_max = Tensor::empty({rows});  // all_reduce(Max)
  for (int64_t r = 0; r < rows; ++r) global_max.select(0, r).fill(std::max(max[0].at(r), max[1].at(r)));
  Tensor total_sums = Tensor::zeros({2, rows});  // all_reduce(Sum)
  for (int i = 0; i < 2; ++i) {
    sums[i] = Tensor::zeros({2, rows});
    ops::loss_exp_sums(slices[i], global_max, target, starts[i], kIgnore, sums[i]);
    total_sums = Tensor::from_vector([&] {
      std::vector<float> a = total_sums.to_vector(), b = sums[i].to_vector();
      for (size_t j = 0; j < a.size(); ++j) a[j] += b[j];
      return a;
    }(), {2, rows});
  }
  const double loss = ops::loss_total(target, kIgnore, global_max, total_sums.select(0, 0), total_sums.select(0, 1));
  EXPECT_NEAR(loss, direct_loss(logits, ids), 1e-4);

  // The gradient of each slice, side by side, is softmax minus the one-hot of the whole rows.
  const float k = 0.5f;
  Tensor whole = logits.clone();
  ops::loss_softmax_grad_(whole, target, 0, kIgnore, global_max, total_sums.select(0, 0), k);
  for (int i = 0; i < 2; ++i) {
    Tensor d = slices[i].clone();
    ops::loss_softmax_grad_(d, target, starts[i], kIgnore, global_max, total_sums.select(0, 0), k);
    Tensor want = whole.transpose(0, 1).narrow(0, starts[i], d.size(1)).transpose(0, 1);
    EXPECT_EQ(d.to_vector(), want.to_vector()) << "slice " << i;
  }
  for (int64_t j = 0; j < v; ++j) EXPECT_EQ(whole.at(1 * v + j), 0.f) << "an ignored row has no gradient";
}

TEST(VocabParallelLoss, OnlineStatisticsOverBlocksMatchOnePass) {
  const int64_t rows = 3, v = 10;
  Tensor logits = Tensor::randn({rows, v}, 2, 0.f, 2.f), target = Tensor::from_ints({9, 4, kIgnore}, {rows});
  Tensor max = Tensor::empty({rows}), sums = Tensor::zeros({2, rows});
  ops::loss_row_max(logits, max);
  ops::loss_exp_sums(logits, max, target, 0, kIgnore, sums);

  Tensor run = Tensor::zeros({3, rows});
  run.select(0, 0).fill(-std::numeric_limits<float>::infinity());
  for (int64_t b0 = 0; b0 < v; b0 += 4) {
    const int64_t nb = std::min<int64_t>(4, v - b0);
    Tensor block = logits.transpose(0, 1).narrow(0, b0, nb).transpose(0, 1);
    ops::loss_online_stats(block, target, b0, kIgnore, run.select(0, 0), run.select(0, 1), run.select(0, 2));
  }
  EXPECT_EQ(run.select(0, 0).to_vector(), max.to_vector());
  EXPECT_TRUE(test::close(run.select(0, 1), sums.select(0, 0), 1e-5, 1e-6));
  EXPECT_EQ(run.select(0, 2).to_vector(), sums.select(0, 1).to_vector());

  // Rescaled to a larger maximum, the sums shrink by e^(old - new).
  Tensor higher = Tensor::full({rows}, 5.0);
  Tensor se = run.select(0, 1).clone();
  ops::loss_rescale_to_max(higher, run.select(0, 0), run.select(0, 1));
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_NEAR(run.at(rows + r), se.at(r) * std::exp(max.at(r) - 5.0), 1e-5 * se.at(r));
  EXPECT_EQ(run.select(0, 0).to_vector(), higher.to_vector());
}

TEST(VocabParallelLoss, AChunksLogitsAreLinearsProduct) {
  Tensor hidden = Tensor::randn({5, 8}, 3), w = Tensor::randn({6, 8}, 4);
  for (DType w_dtype : {DType::F32, DType::BF16}) {
    const ops::LmHeadMath math{w_dtype, false};
    Tensor wd = w.to(w_dtype);
    Tensor saved = ops::lm_head_saved_input(hidden, math);
    const ops::LmHeadScratch scratch = ops::lm_head_scratch(math, 5, 6, 8, false);
    Tensor logits = ops::lm_head_chunk_logits(saved.narrow(0, 1, 3), wd, math, scratch);
    ASSERT_EQ(logits.shape(), (Shape{3, 6}));
    Tensor want = ops::linear(hidden.narrow(0, 1, 3), wd);
    EXPECT_TRUE(test::close(logits, want, 1e-5)) << dtype_name(w_dtype);
  }
}

TEST(VocabParallelLoss, AChunksBackwardIsTheLossGradientThroughTheHead) {
  // f32: dh = d · w and dw += dᵀ · hidden, d the softmax gradient of the logits.
  const int64_t n = 4, v = 6, h = 5;
  Tensor hidden = Tensor::randn({n, h}, 5), w = Tensor::randn({v, h}, 6);
  Tensor target = Tensor::from_ints({1, 5, kIgnore, 0}, {n});
  const ops::LmHeadMath math{DType::F32, false};
  const ops::LmHeadScratch scratch = ops::lm_head_scratch(math, n, v, h, true);
  Tensor logits = ops::lm_head_chunk_logits(hidden, w, math, scratch).clone();
  Tensor max = Tensor::empty({n}), sums = Tensor::zeros({2, n});
  ops::loss_row_max(logits, max);
  ops::loss_exp_sums(logits, max, target, 0, kIgnore, sums);
  Tensor d = logits.clone();
  ops::loss_softmax_grad_(d, target, 0, kIgnore, max, sums.select(0, 0), 2.f);

  Tensor dh = Tensor::empty({n, h}), dw = Tensor::full({v, h}, 1.0);
  ops::lm_head_chunk_backward(hidden, w, math, target, 0, kIgnore, max, sums.select(0, 0), 2.f, scratch, dh, false,
                              dw);
  EXPECT_TRUE(test::close(dh, ops::matmul(d, w), 1e-5));
  EXPECT_TRUE(test::close(dw, ops::add(ops::matmul(d.transpose(0, 1), hidden), Tensor::full({v, h}, 1.0)), 1e-5));
}

}  // namespace
}  // namespace tp
