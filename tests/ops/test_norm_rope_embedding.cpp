// RMSNorm, RoPE (golden values from PyTorch, see rope_golden.py) and embedding.
#include <omp.h>

#include <cmath>
#include <fstream>
#include <map>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/embedding.h"
#include "tp/ops/norm.h"
#include "tp/ops/rope.h"

using namespace tp;
using namespace tp::test;

TEST(RmsNorm, MatchesNaive) {
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{2, 2, 33}}) {
    Tensor x = Tensor::randn(s, 1, 0.f, 2.f), w = Tensor::randn({s.back()}, 2);
    int64_t h = s.back();
    std::vector<float> xv = x.to_vector(), wv = w.to_vector();
    std::vector<double> want(xv.size());
    for (size_t r = 0; r < xv.size() / h; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xv[r * h + i]) * xv[r * h + i];
      double rstd = 1 / std::sqrt(ss / h + 1e-6);
      for (int64_t i = 0; i < h; ++i) want[r * h + i] = wv[i] * xv[r * h + i] * rstd;
    }
    EXPECT_TRUE(close(ops::rms_norm(x, w, 1e-6), want, 1e-5, 1e-5)) << shape_str(s);
    EXPECT_TRUE(close(ops::rms_norm(x, w.to(DType::BF16), 1e-6), want, 2e-2, 1e-2)) << shape_str(s);
  }
  EXPECT_EQ(ops::rms_norm(Tensor::zeros({0, 4}), Tensor::zeros({4}), 1e-6).shape(), (Shape{0, 4}));
  expect_error([] { ops::rms_norm(Tensor::zeros({2, 4}), Tensor::zeros({5}), 1e-6); }, {"[5]", "[2, 4]"});
}

TEST(RmsNorm, Gradcheck) {
  auto fn = [](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1], 1e-5); };
  TP_EXPECT_GRADCHECK(fn, {param({3, 6}, 1), param({6}, 2)});
}

TEST(RmsNorm, WeightOffsetScalesByOnePlusW) {
  // Gemma: (1 + w) * x / rms(x), against a double-precision reference; w = 0 is the plain norm with ones.
  Tensor x = Tensor::randn({3, 5}, 3, 0.f, 2.f), w = Tensor::randn({5}, 4);
  std::vector<float> xv = x.to_vector(), wv = w.to_vector();
  std::vector<double> want(xv.size());
  for (size_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (size_t i = 0; i < 5; ++i) ss += static_cast<double>(xv[r * 5 + i]) * xv[r * 5 + i];
    const double rstd = 1 / std::sqrt(ss / 5 + 1e-6);
    for (size_t i = 0; i < 5; ++i) want[r * 5 + i] = (1.0 + wv[i]) * xv[r * 5 + i] * rstd;
  }
  EXPECT_TRUE(close(ops::rms_norm(x, w, 1e-6, 1.0), want, 1e-5, 1e-5));
  EXPECT_TRUE(equal(ops::rms_norm(x, Tensor::zeros({5}), 1e-6, 1.0), ops::rms_norm(x, Tensor::full({5}, 1.0), 1e-6)));
  EXPECT_EQ(w.to_vector(), wv);  // the offset is added to a copy
  auto fn = [](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1], 1e-5, 1.0); };
  TP_EXPECT_GRADCHECK(fn, {param({3, 6}, 5), param({6}, 6)});
}

namespace {

std::map<std::string, std::vector<double>> load_golden() {
  std::ifstream f(std::string(TP_OPS_TEST_DATA) + "/rope_golden.txt");
  EXPECT_TRUE(f.good()) << "missing rope_golden.txt (run tests/ops/rope_golden.py)";
  std::map<std::string, std::vector<double>> out;
  std::string name;
  size_t n;
  while (f >> name >> n) {
    std::vector<double> v(n);
    for (double& x : v) f >> x;
    out[name] = v;
  }
  return out;
}

}  // namespace

TEST(RmsNorm, InferenceFormsAreBitwiseTheDifferentiableOnes) {
  // The decoder layer's no-grad path swaps add + rms_norm (+ the projection's
  // rounding to bf16) for these; the numbers must not move at all.
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (DType wd : {DType::F32, DType::BF16}) {
      Tensor x = Tensor::randn({3, 70, 96}, 1, 0.f, 3.f), d = Tensor::randn({3, 70, 96}, 2);
      Tensor w = Tensor::randn({96}, 3).to(wd);
      autograd::NoGradGuard no_grad;
      Tensor want = ops::rms_norm(x, w, 1e-6);
      EXPECT_TRUE(equal(ops::rms_norm(x, w, 1e-6, DType::F32), want));
      EXPECT_TRUE(equal(ops::rms_norm(x, w, 1e-6, DType::BF16), want.to(DType::BF16)));
      Tensor sum = ops::add(x, d);
      for (DType out : {DType::F32, DType::BF16}) {
        ops::AddRmsNorm r = ops::add_rms_norm(x, d, w, 1e-5, out);
        EXPECT_TRUE(equal(r.sum, sum)) << threads << " threads";
        EXPECT_TRUE(equal(r.normed, ops::rms_norm(sum, w, 1e-5).to(out))) << threads << " threads";
      }
    }
  }
  omp_set_num_threads(1);
  Tensor x = Tensor::randn({2, 8}, 4).set_requires_grad(true), w = Tensor::randn({8}, 5);
  expect_error([&] { ops::rms_norm(x, w, 1e-6, DType::BF16); }, {"rms_norm", "without gradients"});
  expect_error([&] { ops::add_rms_norm(x, x, w, 1e-6, DType::F32); }, {"add_rms_norm", "without gradients"});
  autograd::NoGradGuard no_grad;
  expect_error([&] { ops::rms_norm(x, w, 1e-6, DType::I64); }, {"out_dtype must be f32 or bf16", "i64"});
  expect_error([&] { ops::add_rms_norm(x, Tensor::randn({2, 7}, 6), Tensor::randn({7}, 7), 1e-6, DType::F32); },
               {"[2, 8]"});
}

TEST(Rope, InvFreqMatchesTorchGolden) {
  auto golden = load_golden();
  ops::RopeScaling llama3{"llama3", 8.0, 1.0, 4.0, 8192};
  auto tensor = [](const std::vector<float>& v) {
    return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  };
  EXPECT_TRUE(close(tensor(ops::rope_inv_freq(128, 500000.0)), golden["default_128_500000"], 0, 1e-6));
  EXPECT_TRUE(close(tensor(ops::rope_inv_freq(128, 500000.0, llama3)), golden["llama3_128_500000"], 0, 1e-6));
  EXPECT_TRUE(close(tensor(ops::rope_inv_freq(8, 500000.0, llama3)), golden["llama3_8_500000"], 0, 1e-6));
  // The scaling really changed something: low frequencies divided by the factor.
  std::vector<float> d = ops::rope_inv_freq(128, 500000.0), l = ops::rope_inv_freq(128, 500000.0, llama3);
  EXPECT_FLOAT_EQ(l[0], d[0]);
  EXPECT_NEAR(l[63], d[63] / 8, 1e-12);
  expect_error([] { ops::rope_inv_freq(8, 1e4, ops::RopeScaling{"yarn"}); }, {"yarn", "default", "llama3"});
  expect_error([] { ops::rope_inv_freq(7, 1e4); }, {"7"});
}

TEST(Rope, ApplyMatchesTorchGolden) {
  auto golden = load_golden();
  std::vector<float> xv(golden["x"].begin(), golden["x"].end());
  std::vector<int64_t> pv(golden["positions"].begin(), golden["positions"].end());
  Tensor x = Tensor::from_vector(xv, {2, 3, 2, 8});
  Tensor pos = Tensor::from_ints(pv, {2, 3});
  std::vector<float> inv = ops::rope_inv_freq(8, 500000.0, {"llama3", 8.0, 1.0, 4.0, 8192});
  // Angles up to 20000 rad: f32 cos/sin of large arguments differ by a few ulps of the angle.
  EXPECT_TRUE(close(ops::apply_rope(x, pos, inv), golden["rope_llama3_8"], 2e-5, 1e-5));
}

TEST(Rope, PartialRotaryPassesTheRestAndGradchecks) {
  Tensor x = Tensor::randn({1, 2, 1, 6}, 1);
  Tensor pos = Tensor::from_ints({3, 4}, {1, 2});
  std::vector<float> inv = {0.5f, 0.1f};  // rotary dim 4 of head dim 6
  Tensor y = ops::apply_rope(x, pos, inv);
  std::vector<float> xv = x.to_vector(), yv = y.to_vector();
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(yv[t * 6 + 4], xv[t * 6 + 4]);
    EXPECT_EQ(yv[t * 6 + 5], xv[t * 6 + 5]);
    double a = (3 + t) * 0.5;
    EXPECT_NEAR(yv[t * 6 + 0], xv[t * 6] * std::cos(a) - xv[t * 6 + 2] * std::sin(a), 1e-5);
  }
  auto fn = [pos, inv](const std::vector<Tensor>& in) { return ops::apply_rope(in[0], pos, inv); };
  TP_EXPECT_GRADCHECK(fn, {param({1, 2, 2, 6}, 2)});
  expect_error([&] { ops::apply_rope(x, Tensor::from_ints({1, 2, 3}, {1, 3}), inv); }, {"[1, 3]", "[1, 2, 1, 6]"});
  expect_error([&] { ops::apply_rope(x, pos, std::vector<float>(4, 1.f)); }, {"[1, 2, 1, 6]"});
}

TEST(Embedding, LooksUpShardedRowsAndZeros) {
  Tensor w = Tensor::randn({4, 3}, 1);
  Tensor ids = Tensor::from_ints({10, 13, 9, 14, 11}, {5}, DType::I32);
  Tensor y = ops::embedding(ids, w, 10);  // this shard holds tokens 10..13
  EXPECT_EQ(y.shape(), (Shape{5, 3}));
  std::vector<float> wv = w.to_vector();
  std::vector<double> want;
  for (int64_t id : {10, 13, 9, 14, 11})
    for (int c = 0; c < 3; ++c) want.push_back(id >= 10 && id < 14 ? wv[(id - 10) * 3 + c] : 0.0);
  EXPECT_TRUE(close(y, want, 0));
  // bf16 table: exactly the bf16-rounded rows.
  Tensor wb = w.to(DType::BF16);
  EXPECT_TRUE(equal(ops::embedding(ids, wb, 10), ops::embedding(ids, wb.to(DType::F32), 10)));
  EXPECT_EQ(ops::embedding(Tensor::from_ints({}, {0, 2}), w).shape(), (Shape{0, 2, 3}));
  expect_error([&] { ops::embedding(Tensor::zeros({2}), w); }, {"f32"});
}

TEST(Embedding, BackwardScatterAddsAndSkipsOtherShards) {
  Tensor w = param({3, 2}, 1);
  Tensor ids = Tensor::from_ints({5, 5, 7, 2, 6}, {5});  // rows 0, 0, 2, (none), 1 with vocab_start 5
  Tensor y = ops::embedding(ids, w, 5);
  Tensor g = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {5, 2});
  autograd::backward(y, g);
  EXPECT_TRUE(close(w.grad(), std::vector<double>{1 + 3, 2 + 4, 9, 10, 5, 6}, 0));
  auto fn = [ids](const std::vector<Tensor>& in) { return ops::embedding(ids, in[0], 5); };
  TP_EXPECT_GRADCHECK(fn, {param({3, 2}, 2)});
}

TEST(Rope, EmptyBatchAndSingleToken) {
  std::vector<float> inv = ops::rope_inv_freq(4, 10000.0);
  EXPECT_EQ(ops::apply_rope(Tensor::zeros({0, 3, 2, 4}), Tensor::zeros({0, 3}, DType::I64), inv).shape(),
            (Shape{0, 3, 2, 4}));
  // Position 0 is the identity.
  Tensor x = Tensor::randn({1, 1, 2, 4}, 1);
  EXPECT_TRUE(equal(ops::apply_rope(x, Tensor::zeros({1, 1}, DType::I64), inv), x));
}

TEST(Rope, InterleavedRotatesAdjacentPairsAsComplexNumbers) {
  // DeepSeek-V2: (x[2i] + i x[2i+1]) * a e^{i pos inv_freq[i]}, output interleaved.
  Tensor x = Tensor::randn({2, 3, 2, 6}, 1), pos = Tensor::from_ints({0, 1, 5, 2, 7, 9}, {2, 3});
  const std::vector<float> inv = ops::rope_inv_freq(4, 100.0);  // 4 of 6 dims rotate
  const float amp = 1.25f;
  Tensor y = ops::apply_rope(x, pos, inv, {.layout = ops::RopeLayout::Interleaved, .attention_factor = amp});
  std::vector<float> xv = x.to_vector(), yv = y.to_vector();
  std::vector<int64_t> p = pos.to_int_vector();
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t o = (r * 2 + h) * 6;
      for (int64_t i = 0; i < 2; ++i) {
        const double a = static_cast<double>(static_cast<float>(p[r]) * inv[i]);
        const double re = xv[o + 2 * i], im = xv[o + 2 * i + 1];
        EXPECT_NEAR(yv[o + 2 * i], amp * (re * std::cos(a) - im * std::sin(a)), 1e-5);
        EXPECT_NEAR(yv[o + 2 * i + 1], amp * (im * std::cos(a) + re * std::sin(a)), 1e-5);
      }
      EXPECT_EQ(yv[o + 4], xv[o + 4]);
      EXPECT_EQ(yv[o + 5], xv[o + 5]);
    }
  auto fn = [pos, inv](const std::vector<Tensor>& in) {
    return ops::apply_rope(in[0], pos, inv, {.layout = ops::RopeLayout::Interleaved, .attention_factor = 0.8f});
  };
  TP_EXPECT_GRADCHECK(fn, {param({2, 3, 2, 6}, 2)});
}

TEST(Rope, YarnBlendsInterpolatedAndExtrapolatedFrequencies) {
  // dim 8, theta 1e4, original context 64: correction range [0, 2) (truncated).
  ops::YarnRope y = ops::rope_yarn(8, 10000.0, {.factor = 4, .original_max_position_embeddings = 64});
  const std::vector<float> base = ops::rope_inv_freq(8, 10000.0);
  EXPECT_FLOAT_EQ(y.inv_freq[0], base[0]);
  EXPECT_FLOAT_EQ(y.inv_freq[2], base[2] / 4);
  EXPECT_NEAR(y.attention_factor, 0.1 * std::log(4.0) + 1, 1e-12);  // no mscale keys: yarn_mscale(factor)
  EXPECT_NEAR(ops::rope_yarn(8, 1e4, {.factor = 4, .original_max_position_embeddings = 64, .attention_factor = 2})
                  .attention_factor, 2.0, 0);
  expect_error([] { ops::rope_yarn(8, 1e4, {.factor = 4, .original_max_position_embeddings = 0}); },
               {"invalid yarn rope_scaling", "original_max_position_embeddings 0"});
}
