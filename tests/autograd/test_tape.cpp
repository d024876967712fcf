// Tape basics, exercised through real ops: accumulation across backward calls,
// NoGradGuard, a diamond graph, and backward through the shape ops.
#include <gtest/gtest.h>

#include "tp/autograd/tape.h"
#include "tp/ops/ops.h"
#include "autograd/recording_leaf_by_rows.h"

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

// The hook data parallelism starts its bucket reductions from: each leaf is
// reported once, as soon as its last use has run, with its whole gradient of
// this backward already in place; leaves used late in the forward come first.
TEST(Tape, LeafGradReadyHookReportsCompleteGradientsInBackwardOrder) {
  Tensor a = leaf({1, 2}, {2}), b = leaf({3, 4}, {2}), c = leaf({5, 6}, {2});
  Tensor y = ops::mul(a, b);                 // a used here and again below
  Tensor z = ops::add(ops::mul(y, c), a);    // c used once, late
  std::vector<std::pair<const TensorImpl*, std::vector<float>>> seen;
  {
    autograd::LeafGradReadyHook hook([&](const TensorImpl* leaf) {
      const Tensor& t = leaf == a.impl() ? a : leaf == b.impl() ? b : c;
      seen.emplace_back(leaf, grad_of(t));
    });
    autograd::backward(ops::sum(z));
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].first, c.impl()) << "c's only use is the newest";
  EXPECT_EQ(seen[0].second, (std::vector<float>{3, 8}));         // dz/dc = a*b
  // a and b are last used by the oldest entry (y = a*b): reported after it, in input order.
  EXPECT_EQ(seen[1].first, a.impl());
  EXPECT_EQ(seen[1].second, (std::vector<float>{16, 25}));   // b*c + 1: both uses of a
  EXPECT_EQ(seen[2].first, b.impl());
  EXPECT_EQ(grad_of(a), (std::vector<float>{16, 25})) << "nothing added after the report";
  EXPECT_EQ(grad_of(b), (std::vector<float>{5, 12}));
  // Without a hook nothing is reported, and the gradients are the same.
  a.zero_grad();
  autograd::backward(ops::sum(ops::add(ops::mul(ops::mul(a, b), c), a)));
  EXPECT_EQ(grad_of(a), (std::vector<float>{16, 25}));
  EXPECT_EQ(seen.size(), 3u);
}

// A chain of ops that each save their input (mul keeps both operands): when the
// oldest entry's backward runs, the activations of every later entry are gone
// (the tape keeps no input's data and drops each closure once it has run), and
// the linear entries keep one bf16 copy for q|k|v-like siblings reading one input.
TEST(Tape, BackwardFreesEachEntrysSavedTensorsAsItGoes) {
  const int64_t n = 1 << 18;  // 1 MiB of f32 per activation
  Tensor x = Tensor::randn({n}, 1);
  x.set_requires_grad(true);
  size_t live_at_first_entry = 0;
  Tensor h = x.clone();
  h.set_requires_grad(true);
  // The oldest entry: reports the live bytes when the backward reaches it.
  Tensor probe = h.reshape({n});
  autograd::record("probe", {h}, {probe}, [&](const std::vector<Tensor>& g) {
    live_at_first_entry = allocator_stats().tensor_bytes;
    return std::vector<Tensor>{g[0]};
  });
  Tensor y = probe;
  for (int i = 0; i < 8; ++i) y = ops::mul(y, ops::scale(y, 0.5));  // 16 activations of 1 MiB, saved
  Tensor loss = ops::sum(y);
  y = Tensor();
  const size_t live_before = allocator_stats().tensor_bytes;
  autograd::backward(loss);
  ASSERT_GT(live_at_first_entry, 0u);
  // Before the backward the chain's 16 MiB were live; when its oldest entry runs at most
  // a few gradients of 1 MiB are.
  EXPECT_LT(live_at_first_entry + (12u << 20), live_before)
      << "live " << (live_at_first_entry >> 20) << " MiB at the oldest entry, " << (live_before >> 20)
      << " MiB before the backward";
  EXPECT_TRUE(h.grad().defined());
}

TEST(Tape, LinearsReadingOneInputSaveOneBf16Copy) {
  const int64_t rows = 256, k = 512;
  Tensor x = Tensor::randn({rows, k}, 2);
  x.set_requires_grad(true);
  std::vector<Tensor> ws;
  for (int i = 0; i < 3; ++i) ws.push_back(Tensor::randn({64, k}, 3 + i, 0, 0.1f).to(DType::BF16).set_requires_grad(true));
  Tensor h = ops::scale(x, 1.0);  // an activation only the linears hold once h is dropped
  std::vector<Tensor> ys{ops::linear(h, ws[0])};
  const size_t after_first = allocator_stats().tensor_bytes;
  ys.push_back(ops::linear(h, ws[1]));
  ys.push_back(ops::linear(h, ws[2]));
  const size_t after_siblings = allocator_stats().tensor_bytes;
  const size_t out_bytes = rows * 64 * 4, bytes_of_h = rows * k * 4;
  // The siblings add their outputs only, not a bf16 copy (256 KiB) each.
  EXPECT_LE(after_siblings - after_first, 2 * out_bytes + 4096) << "the siblings saved copies of their own";
  h = Tensor();
  // Nothing kept h itself (f32): the tape holds no input's data, the linears the bf16 copy.
  EXPECT_GE(after_siblings - allocator_stats().tensor_bytes, bytes_of_h) << "the f32 input stayed alive";
  autograd::backward(ops::sum(ops::add(ops::add(ys[0], ys[1]), ys[2])));
  EXPECT_TRUE(x.grad().defined());
}

// A leaf held by rows: the embedding reads its rows a block at a time and makes
// its gradient block by block (every block, rows no id touched included), and a
// gradient the engine holds whole (a linear's) is handed over in blocks; the
// output and the sum of the blocks are those without it.
TEST(Tape, LeafByRowsIsReadAndTakesItsGradientByBlocksOfRows) {
  const int64_t V = 11, H = 5;
  Tensor w0 = Tensor::randn({V, H}, 4);
  Tensor ids = Tensor::from_ints({3, 0, 3, 10, 7}, {5});
  Tensor x = Tensor::randn({5, H}, 6);
  auto run = [&](const std::shared_ptr<tp::testing::RecordingLeafByRows>& by_rows) {
    Tensor w = w0.clone();
    w.set_requires_grad(true);
    if (by_rows) autograd::set_leaf_by_rows(w, by_rows);
    EXPECT_FALSE(autograd::leaf_grad_buffer(w).defined());
    Tensor e = ops::embedding(ids, w);
    Tensor y = ops::linear(ops::mul(e, x), w);  // [5, V]: w again, as lm_head
    autograd::backward(ops::sum(ops::mul(y, y)));
    return std::make_pair(e.to_vector(), by_rows ? Tensor() : w.grad());
  };
  const auto [want_e, want] = run(nullptr);
  auto by_rows = std::make_shared<tp::testing::RecordingLeafByRows>(w0, 4);
  const auto [got_e, kept] = run(by_rows);
  EXPECT_FALSE(kept.defined()) << "the leaf kept a gradient of its own";
  EXPECT_EQ(got_e, want_e) << "the embedding read by blocks";
  EXPECT_EQ(by_rows->reads, 3) << "blocks of 4, 4, 3 rows read by the embedding";
  EXPECT_EQ(by_rows->blocks, 6) << "3 gradient blocks from each backward";
  std::vector<float> got = by_rows->whole.to_vector(), expect = want.to_vector();
  ASSERT_EQ(got.size(), expect.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-5 * (1 + std::fabs(expect[i]))) << i;
}
