#include <cmath>
#include <cstring>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/nn/layers.h"
#include "tp/ops/detail/bf16_gemv.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/gemm.h"
#include "tp/ops/linear.h"
#include "tp/ops/ordered_gemm.h"
#include "tp/tensor/convert.h"

using namespace tp;
using namespace tp::test;

namespace {

// Naive oracle: y[m, n] = sum_k x[m, k] w[n, k] + b[n], in double.
std::vector<double> naive_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  Shape rows = x.shape();
  rows.pop_back();
  int64_t n = w.size(0), k = w.size(1), m = numel(rows);
  std::vector<float> xs = x.to_vector(), ws = w.to_vector(), bs = b.defined() ? b.to_vector() : std::vector<float>();
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = b.defined() ? bs[j] : 0;
      for (int64_t t = 0; t < k; ++t) s += static_cast<double>(xs[i * k + t]) * ws[j * k + t];
      y[i * n + j] = s;
    }
  return y;
}

}  // namespace

TEST(Linear, MatchesNaiveOnOddShapes) {
  for (auto [m, k, n] : {std::tuple{1, 1, 1}, {1, 37, 5}, {7, 13, 29}, {33, 65, 17}, {130, 300, 70}}) {
    Tensor x = Tensor::randn({m, k}, 1), w = Tensor::randn({n, k}, 2), b = Tensor::randn({n}, 3);
    EXPECT_TRUE(close(ops::linear(x, w), naive_linear(x, w, Tensor()), 1e-4, 1e-4)) << m << "x" << k << "x" << n;
    EXPECT_TRUE(close(ops::linear(x, w, b), naive_linear(x, w, b), 1e-4, 1e-4));
    ops::PackedLinear p(w);
    EXPECT_TRUE(close(ops::linear(x, p, b), naive_linear(x, w, b), 1e-4, 1e-4));
  }
}

TEST(Linear, LeadingDimsAndEmpty) {
  Tensor x = Tensor::randn({2, 3, 8}, 4), w = Tensor::randn({5, 8}, 5);
  Tensor y = ops::linear(x, w);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  EXPECT_TRUE(close(y, naive_linear(x, w, Tensor()), 1e-4, 1e-4));
  Tensor empty_rows = ops::linear(Tensor::zeros({0, 8}), w);
  EXPECT_EQ(empty_rows.shape(), (Shape{0, 5}));
  // K = 0: every output is the bias.
  Tensor b = Tensor::randn({5}, 6);
  Tensor yk = ops::linear(Tensor::zeros({3, 0}), Tensor::zeros({5, 0}), b);
  EXPECT_TRUE(close(yk.narrow(0, 2, 1).reshape({5}), b, 0));
  EXPECT_EQ(ops::linear(Tensor::zeros({0, 8}), ops::PackedLinear(w)).numel(), 0);
}

TEST(Linear, OneRowBf16MatchesRoundedMathAndBatchRows) {
  // Decode: one row against a packed bf16 weight (oneDNN may pick another kernel
  // for M = 1). K and N off oneDNN's 32 x 64 tiles, small and wide, with bias; the
  // same rows in one batch must agree.
  for (auto [k, n] : {std::pair<int64_t, int64_t>{64, 48}, {100, 10}, {1000, 200}, {1024, 3072}, {33, 1100}}) {
    Tensor w = Tensor::randn({n, k}, 8, 0.f, 0.1f).to(DType::BF16), b = Tensor::randn({n}, 9);
    ops::PackedLinear p(w, /*keep_weight=*/false);
    Tensor xs = Tensor::randn({3, k}, 7);
    Tensor batch = ops::linear(xs, p, b);  // M = 3: oneDNN
    for (int64_t r = 0; r < 3; ++r) {
      Tensor x = xs.narrow(0, r, 1);
      std::vector<double> ref = naive_linear(x.to(DType::BF16).to(DType::F32), w.to(DType::F32), b);
      Tensor y = ops::linear(x, p, b);
      EXPECT_TRUE(close(y, ref, 1e-4, 1e-4)) << "k=" << k << " n=" << n;
      EXPECT_TRUE(close(y, batch.narrow(0, r, 1), 1e-4, 1e-4)) << "k=" << k << " n=" << n;
    }
  }
  EXPECT_EQ(ops::PackedLinear(Tensor::randn({10, 100}, 1).to(DType::BF16)).packed_copies(), 1u);
}

// A CPU whose oneDNN has no bf16 matmul (AVX2 only), or TP_BF16_GEMM=widen (the
// test_ops_bf16_widened run): bf16 products are f32 GEMMs of the widened values.
TEST(Linear, WithoutBf16MatmulsBf16IsTheF32ProductOfTheWidenedValues) {
  if (ops::detail::bf16_matmul_available()) GTEST_SKIP() << "oneDNN has bf16 matmuls here (test_ops_bf16_widened)";
  EXPECT_FALSE(ops::detail::bf16_gemm_native());
  Tensor w = Tensor::randn({24, 40}, 50).to(DType::BF16), x = Tensor::randn({5, 40}, 51), b = Tensor::randn({24}, 52);
  Tensor want = ops::linear(x.to(DType::BF16).to(DType::F32), w.to(DType::F32), b);
  EXPECT_TRUE(equal(ops::linear(x, w, b), want));
  // Packed: what the same packed product of the widened values gives (oneDNN's, or
  // ordered_gemm's where that runs).
  const Tensor want_packed = ops::linear(x.to(DType::BF16).to(DType::F32), ops::PackedLinear(w.to(DType::F32)), b);
  for (bool keep : {true, false}) {
    ops::PackedLinear packed(w, keep);
    EXPECT_TRUE(equal(ops::linear(x, packed, b), want_packed)) << "keep_weight " << keep;
    EXPECT_TRUE(equal(ops::linear(x.to(DType::BF16), packed, b), want_packed))
        << "bf16 input, keep_weight " << keep;
  }
}

// Where inference runs ordered_gemm, a PackedLinear runs it (not oneDNN) for f32 and
// bf16 weights (and a bf16 weight's bf16 input), and each row has its bits alone.
TEST(Linear, PackedRunsOrderedGemmWhereWanted) {
  if (!ops::detail::ordered_gemm_wanted()) GTEST_SKIP() << "oneDNN's brgemm runs here (test_ops_ordered forces it)";
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor w = Tensor::randn({37, 50}, 60, 0.f, 0.1f, dtype), b = Tensor::randn({37}, 61);
    ops::PackedLinear packed(w, /*keep_weight=*/false);
    for (DType x_dtype : {DType::F32, DType::BF16}) {
      if (x_dtype == DType::BF16 && dtype != DType::BF16) continue;  // a bf16 input is for bf16 weights only
      Tensor x = Tensor::randn({5, 50}, 62, 0.f, 1.f, x_dtype), out = Tensor::empty({5, 37});
      EXPECT_EQ(ops::detail::linear_into_path(out, x, packed, b, ops::detail::Bf16Path::Auto),
                ops::detail::Bf16Kernel::Ordered);
      std::vector<float> want(5 * 37);
      ops::detail::ordered_gemm(5, 37, 50, x.raw_data(), x_dtype, 50, w.raw_data(), dtype, 50, b.data<float>(),
                                want.data(), 37);
      EXPECT_EQ(std::memcmp(out.raw_data(), want.data(), out.nbytes()), 0) << dtype_name(dtype);
      for (int64_t r = 0; r < 5; ++r)
        EXPECT_TRUE(equal(ops::linear(x.narrow(0, r, 1), packed, b), out.narrow(0, r, 1))) << "row " << r;
    }
  }
}

TEST(Linear, Bf16WeightsTrackF32) {
  Tensor x = Tensor::randn({19, 64}, 7), w = Tensor::randn({48, 64}, 8, 0.f, 0.1f);
  Tensor wb = w.to(DType::BF16);
  // Reference: the bf16-rounded weights and bf16-rounded x, exact f32 math.
  Tensor xr = x.to(DType::BF16).to(DType::F32), wr = wb.to(DType::F32);
  std::vector<double> ref = naive_linear(xr, wr, Tensor());
  EXPECT_TRUE(close(ops::linear(x, wb), ref, 1e-3, 1e-3));
  EXPECT_TRUE(close(ops::linear(x, ops::PackedLinear(wb)), ref, 1e-3, 1e-3));
  // And within bf16 rounding of the f32 result.
  EXPECT_TRUE(close(ops::linear(x, ops::PackedLinear(wb)), naive_linear(x, w, Tensor()), 0.05, 0.02));
}

TEST(Linear, PackedRepeatsAndRepack) {
  Tensor w = Tensor::randn({24, 40}, 9);
  ops::PackedLinear p(w);
  EXPECT_EQ(p.in_features(), 40);
  EXPECT_EQ(p.out_features(), 24);
  for (int64_t m : {1, 5, 64, 1, 5}) {
    Tensor x = Tensor::randn({m, 40}, 10 + m);
    EXPECT_TRUE(close(ops::linear(x, p), naive_linear(x, w, Tensor()), 1e-4, 1e-4)) << "m=" << m;
  }
  EXPECT_EQ(p.packed_copies(), 1u);  // one packed layout serves every row count
  // Repeated unpacked calls reuse their cached primitive.
  Tensor x0 = Tensor::randn({9, 40}, 20);
  ops::linear(x0, w);
  size_t created = ops::detail::gemm_primitives_created();
  for (int r = 0; r < 3; ++r) ops::linear(x0, w);
  EXPECT_EQ(ops::detail::gemm_primitives_created(), created);
  // After an in-place weight update, stale until repack().
  Tensor x = Tensor::randn({3, 40}, 11);
  w.fill(0.5);
  ops::PackedLinear copy = p;  // copies share the packed state
  p.repack();
  EXPECT_TRUE(close(ops::linear(x, copy), naive_linear(x, w, Tensor()), 1e-4, 1e-4));
}

TEST(Linear, PackedWithoutOriginalWeightIsInferenceOnly) {
  Tensor w = Tensor::randn({12, 20}, 30).to(DType::BF16);
  ops::PackedLinear p(w, /*keep_weight=*/false);
  EXPECT_FALSE(p.weight().defined());
  EXPECT_EQ(p.out_features(), 12);
  EXPECT_EQ(p.in_features(), 20);
  for (int64_t m : {1, 3, 200}) {  // other row counts repack from the packed copy if needed
    Tensor x = Tensor::randn({m, 20}, 31);
    EXPECT_TRUE(close(ops::linear(x, p), ops::linear(x, w), 1e-5, 1e-5)) << "m=" << m;
  }
  expect_error([&] { p.repack(); }, {"[12, 20]", "released"});
  expect_error([&] { ops::linear(param({2, 20}, 32), p); }, {"[12, 20]", "NoGradGuard"});
  {
    autograd::NoGradGuard no_grad;
    EXPECT_EQ(ops::linear(param({2, 20}, 33), p).shape(), (Shape{2, 12}));
  }
}

TEST(Linear, Bf16InputIntoPackedBf16WeightEqualsRoundingF32Input) {
  // A packed bf16 weight rounds an f32 input to bf16 before the GEMM; handing it
  // the bf16 input directly must give bitwise the same output.
  Tensor w = Tensor::randn({24, 40}, 40).to(DType::BF16), b = Tensor::randn({24}, 41);
  ops::PackedLinear p(w);
  // Gradients through the weight need the f32 input the backward multiplies by.
  Tensor wg = Tensor::randn({24, 40}, 46).to(DType::BF16).set_requires_grad(true);
  expect_error([&] { ops::linear(Tensor::randn({2, 40}, 47).to(DType::BF16), ops::PackedLinear(wg)); },
               {"bf16 input [2, 40] is for inference", "[24, 40]"});
  autograd::NoGradGuard no_grad;
  for (int64_t m : {1, 5, 70}) {
    Tensor x = Tensor::randn({m, 40}, 42);
    EXPECT_TRUE(equal(ops::linear(x.to(DType::BF16), p, b), ops::linear(x, p, b))) << "m=" << m;
  }
  // Only a packed bf16 weight takes it: f32 weights and the unpacked path say what they accept.
  Tensor xb = Tensor::randn({2, 40}, 43).to(DType::BF16);
  expect_error([&] { ops::linear(xb, ops::PackedLinear(w.to(DType::F32))); },
               {"input must be f32 (or bf16 into a packed bf16 weight)", "got bf16", "weight f32"});
  expect_error([&] { ops::linear(xb, w); }, {"input must be f32", "got bf16"});
}

TEST(Linear, ModuleTakesBf16InputOnEveryPath) {
  // The decoder layer hands nn::Linear a bf16 input when its weight is packed
  // bf16; any other path (unpacked, f32 packed) widens it, exactly.
  autograd::NoGradGuard no_grad;
  Tensor x = Tensor::randn({3, 40}, 44), xb = x.to(DType::BF16), xr = xb.to(DType::F32);
  for (DType wd : {DType::BF16, DType::F32}) {
    nn::Linear lin("proj", 40, 24, false);
    lin.weight.data = Tensor::randn({24, 40}, 45).to(wd);
    EXPECT_FALSE(lin.takes_bf16_input());
    EXPECT_TRUE(equal(lin(xb), lin(xr))) << "unpacked " << dtype_name(wd);
    lin.finalize_weights(/*inference_only=*/true);
    EXPECT_EQ(lin.takes_bf16_input(), wd == DType::BF16);
    EXPECT_TRUE(equal(lin(xb), lin(xr))) << "packed " << dtype_name(wd);
    if (wd == DType::BF16) {
      EXPECT_TRUE(equal(lin(xb), lin(x)));  // it rounds an f32 input the same way
    }
  }
}

TEST(Linear, LinearIntoWritesPreallocated) {
  Tensor w = Tensor::randn({16, 32}, 12).to(DType::BF16), b = Tensor::randn({16}, 13);
  ops::PackedLinear p(w);
  Tensor x = Tensor::randn({2, 1, 32}, 14);
  Tensor out = Tensor::empty({2, 1, 16});
  void* before = out.raw_data();
  ops::linear_into(out, x, p, b);
  EXPECT_EQ(out.raw_data(), before);
  EXPECT_TRUE(close(out, ops::linear(x, w, b), 1e-5, 1e-5));
  Tensor wrong = Tensor::empty({2, 16});
  expect_error([&] { ops::linear_into(wrong, x, p, b); }, {"[2, 1, 16]", "[2, 16]"});
}

TEST(Linear, Gradcheck) {
  auto fn = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  TP_EXPECT_GRADCHECK(fn, {param({3, 2, 5}, 1), param({4, 5}, 2), param({4}, 3)});
  auto packed = [](const std::vector<Tensor>& in) {
    return ops::linear(in[0], ops::PackedLinear(in[1]), in[2]);
  };
  TP_EXPECT_GRADCHECK(packed, {param({1, 7}, 4), param({3, 7}, 5), param({3}, 6)});
}

TEST(Linear, Bf16WeightGradientIsF32OfWeightShape) {
  Tensor x = param({4, 8}, 1);
  Tensor w = Tensor::randn({3, 8}, 2).to(DType::BF16);
  w.set_requires_grad(true);
  Tensor y = ops::linear(x, w);
  autograd::backward(y, Tensor::full(y.shape(), 1.0));
  // dW[n, k] = sum_m x[m, k]; dx[m, k] = sum_n w[n, k].
  std::vector<float> xs = x.to_vector(), ws = w.to_vector();
  std::vector<double> dw(24), dx(32);
  for (int n = 0; n < 3; ++n)
    for (int k = 0; k < 8; ++k)
      for (int m = 0; m < 4; ++m) dw[n * 8 + k] += xs[m * 8 + k];
  for (int m = 0; m < 4; ++m)
    for (int k = 0; k < 8; ++k)
      for (int n = 0; n < 3; ++n) dx[m * 8 + k] += ws[n * 8 + k];
  EXPECT_EQ(w.grad().dtype(), DType::BF16);
  EXPECT_TRUE(close(w.grad(), dw, 0.05, 0.01));
  EXPECT_TRUE(close(x.grad(), dx, 1e-2, 1e-2));
}

TEST(Matmul, MatchesNaiveAndGradchecks) {
  Tensor a = Tensor::randn({2, 3, 5}, 1), b = Tensor::randn({5, 4}, 2);
  Tensor wt = b.transpose(0, 1);  // [N, K]: matmul(a, b) == linear(a, b^T)
  EXPECT_TRUE(close(ops::matmul(a, b), naive_linear(a, wt, Tensor()), 1e-4, 1e-4));
  auto fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); };
  TP_EXPECT_GRADCHECK(fn, {param({2, 3, 5}, 3), param({5, 4}, 4)});
  EXPECT_EQ(ops::matmul(Tensor::zeros({0, 5}), b).shape(), (Shape{0, 4}));
}

TEST(Linear, MismatchErrorsNameBothShapesAndDtypes) {
  Tensor x = Tensor::randn({2, 6}, 1), w = Tensor::randn({3, 5}, 2);
  expect_error([&] { ops::linear(x, w); }, {"[2, 6]", "[3, 5]"});
  expect_error([&] { ops::linear(x, Tensor::randn({3, 6}, 3), Tensor::zeros({4})); }, {"[4]", "[3, 6]"});
  expect_error([&] { ops::linear(x.to(DType::BF16), Tensor::randn({3, 6}, 3)); }, {"bf16", "f32"});
  expect_error([&] { ops::linear(x, Tensor::zeros({3, 6}, DType::I32)); }, {"i32"});
  expect_error([&] { ops::matmul(x, Tensor::randn({5, 2}, 4)); }, {"[2, 6]", "[5, 2]"});
  expect_error([&] { ops::PackedLinear(Tensor::zeros({3}, DType::F32)); }, {"[3]"});
}

TEST(Linear, NoGradRecordsNothing) {
  Tensor x = param({2, 4}, 1);
  Tensor w = Tensor::randn({3, 4}, 2);
  autograd::clear_tape();
  {
    autograd::NoGradGuard g;
    ops::linear(x, w);
  }
  EXPECT_EQ(autograd::tape_size(), 0u);
  ops::linear(Tensor::randn({2, 4}, 3), w);  // nothing requires grad
  EXPECT_EQ(autograd::tape_size(), 0u);
  ops::linear(x, w);
  EXPECT_EQ(autograd::tape_size(), 1u);
  autograd::clear_tape();
}

TEST(Linear, Bf16ArithmeticOnF32StorageEqualsNativeBf16) {
  // compute = BF16 over an f32 weight holding bf16 values: x and dy rounded to bf16
  // values, f32 GEMMs. The products equal native bf16's (a product of two bf16
  // values is exact in f32): only the order of the f32 sums differs.
  for (auto [m, k, n] : {std::tuple{64, 96, 80}, {130, 300, 70}}) {
    Tensor w16 = Tensor::randn({n, k}, 20, 0.f, 0.1f).to(DType::BF16);
    Tensor w32 = w16.to(DType::F32), xs = Tensor::randn({m, k}, 21), r = Tensor::randn({m, n}, 22);
    Tensor x_native = xs.clone(), x_f32 = xs.clone();
    x_native.set_requires_grad(true);
    x_f32.set_requires_grad(true);
    w16.set_requires_grad(true);
    w16.set_grad(Tensor::zeros({n, k}));  // f32 gradients for the bf16 weight, as a trainer gives it
    w32.set_requires_grad(true);
    Tensor y_native = ops::linear(x_native, w16), y_f32 = ops::linear(x_f32, w32, Tensor(), DType::BF16);
    EXPECT_LE(max_abs_diff(y_native, y_f32), 1e-5 * max_abs(y_native));
    // ... and differ from f32 arithmetic by bf16's rounding of x.
    EXPECT_GT(max_abs_diff(ops::linear(xs, w32), y_f32), 1e-4 * max_abs(y_native));
    autograd::backward(ops::sum(ops::mul(y_native, r)));
    autograd::backward(ops::sum(ops::mul(y_f32, r)));
    EXPECT_LE(max_abs_diff(x_native.grad(), x_f32.grad()), 1e-5 * max_abs(x_native.grad()));
    EXPECT_LE(max_abs_diff(w16.grad(), w32.grad()), 1e-5 * max_abs(w16.grad()));
  }
}

TEST(Linear, RoundF32ToBf16MatchesScalarRounding) {
  std::vector<float> v = Tensor::randn({4099}, 30, 0.f, 100.f).to_vector();
  for (float special : {0.f, -0.f, 1.f + 1.f / 256, 1.f + 3.f / 256, INFINITY, -INFINITY, NAN, 3.0e38f, 1e-40f})
    v.push_back(special);
  std::vector<float> out(v.size());
  round_f32_to_bf16(v.data(), out.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = to_f32(to_bf16(v[i]));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
    } else {
      EXPECT_EQ(out[i], want) << "element " << i << " = " << v[i];
    }
  }
}

TEST(Gemm, RowMajorBWithAConflictingStrideIsCopiedToPaddedRowsAndStaysExact) {
  // [M x K] x [K x 3072]: B's 12 KiB rows go through a padded copy (see gemm.cpp).
  for (int64_t n : {3072, 3073}) {
    const int64_t m = 96, k = 64;
    Tensor a = Tensor::randn({m, k}, 40), b = Tensor::randn({k, n}, 41), c = Tensor::empty({m, n});
    ops::detail::gemm({m, n, k, false, false, DType::F32, DType::F32}, a.raw_data(), b.raw_data(), nullptr,
                      c.data<float>());
    // b^T as an [n, k] weight: the naive linear computes a · b.
    EXPECT_TRUE(close(c, naive_linear(a, b.transpose(0, 1), Tensor()), 1e-4, 1e-4)) << n;
  }
}

namespace {

// Every value kind VDPBF16PS treats specially: zeros of both signs and bf16 denormals (taken as zeros).
Tensor with_specials(Tensor t, uint64_t seed) {
  float* v = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = static_cast<int64_t>(seed % 7); i < n; i += 97)
    v[i] = (i % 3 == 0) ? -0.f : (i % 3 == 1) ? 0.f : 3e-39f;
  for (int64_t i = static_cast<int64_t>(seed % 11); i < n; i += 89) v[i] = (i % 2 ? -1.f : 1.f) * 1e-39f;
  return t;
}

// y = x · w^T + b summed as VDPBF16PS does per lane: for each pair, the odd k's
// product and then the even one's, each an FMA in f32; bf16 denormal inputs as zeros;
// the bias added last.
std::vector<float> pair_order_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  auto value = [](float v) {
    const float r = to_f32(to_bf16(v));
    return std::fpclassify(r) == FP_SUBNORMAL ? std::copysign(0.f, r) : r;
  };
  std::vector<float> xs = x.to_vector(), ws = w.to(DType::F32).to_vector(), y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t t = 0; t < k; t += 2) {
        acc = std::fma(value(xs[i * k + t + 1]), value(ws[j * k + t + 1]), acc);
        acc = std::fma(value(xs[i * k + t]), value(ws[j * k + t]), acc);
      }
      y[i * n + j] = b.defined() ? acc + b.to_vector()[j] : acc;
    }
  return y;
}

}  // namespace

TEST(Linear, Bf16PairedProbeFindsVdpbf16psOrder) {
  // Where oneDNN's bf16 GEMM sums in VDPBF16PS's pair order (a scalar oracle says
  // so), the paired form must be found exact and used; where it doesn't, it must not.
  const int64_t m = 64, k = 96, n = 70;
  Tensor w = with_specials(Tensor::randn({n, k}, 50, 0.f, 0.05f), 3).to(DType::BF16);
  Tensor x = with_specials(Tensor::randn({m, k}, 51, 0.f, 3.f), 4), b = Tensor::randn({n}, 52);
  Tensor native = Tensor::empty({m, n});
  ops::detail::linear_into_path(native, x, ops::PackedLinear(w), b, ops::detail::Bf16Path::Native);
  const std::vector<float> want = pair_order_linear(x, w, b), got = native.to_vector();
  const bool pair_order = std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
  EXPECT_EQ(ops::detail::bf16_paired_f32_exact(), pair_order);
  if (!pair_order) GTEST_SKIP() << "this CPU's bf16 GEMM does not sum in VDPBF16PS's pair order";
  Tensor paired = Tensor::empty({m, n});
  ASSERT_EQ(ops::detail::linear_into_path(paired, x, ops::PackedLinear(w), b, ops::detail::Bf16Path::Paired),
            ops::detail::Bf16Kernel::Paired);
  EXPECT_EQ(paired.to_vector(), want);
}

TEST(Linear, PairedF32GivesNativeBf16Bits) {
  // Prefill's bf16 GEMMs may run as f32 GEMMs over pair-swapped operands
  // (ops/bf16_pairs.h), which must give oneDNN's bf16 bits exactly: tokens stay the same.
  if (!ops::detail::bf16_paired_f32_exact())
    GTEST_SKIP() << "this CPU's bf16 GEMM does not sum in VDPBF16PS's pair order; the paired form stays off";
  // One panel, odd K blocks, tails, several chunks (K = 3072: 2 panels a chunk), M of 1 and of prefill.
  for (auto [m, k, n] : {std::tuple{64, 64, 1},
                         {64, 1024, 64},
                         {100, 1000, 200},
                         {70, 3072, 1100},
                         {512, 1024, 3072},
                         {1, 256, 130},
                         {65, 2, 65},
                         {80, 330, 6200}}) {
    Tensor w = with_specials(Tensor::randn({n, k}, 40, 0.f, 0.05f), 1).to(DType::BF16);
    Tensor b = Tensor::randn({n}, 41);
    Tensor x = with_specials(Tensor::randn({m, k}, 42, 0.f, 3.f), 2);
    ops::PackedLinear p(w, /*keep_weight=*/false);
    for (bool bias : {false, true})
      for (DType xd : {DType::F32, DType::BF16}) {
        Tensor xi = xd == DType::F32 ? x : x.to(DType::BF16);
        Tensor native = Tensor::empty({m, n}), paired = Tensor::empty({m, n});
        EXPECT_EQ(ops::detail::linear_into_path(native, xi, p, bias ? b : Tensor(), ops::detail::Bf16Path::Native),
                  ops::detail::Bf16Kernel::OneDnn);
        ASSERT_EQ(ops::detail::linear_into_path(paired, xi, p, bias ? b : Tensor(), ops::detail::Bf16Path::Paired),
                  ops::detail::Bf16Kernel::Paired);
        int64_t differ = 0;
        for (int64_t i = 0; i < m * n; ++i)
          differ += std::memcmp(native.data<float>() + i, paired.data<float>() + i, sizeof(float)) != 0;
        EXPECT_EQ(differ, 0) << m << "x" << k << "x" << n << " bias " << bias << " x " << dtype_name(xd);
      }
  }
  // Auto takes it from 64 rows for a weight that prefers f32 GEMMs (where they are the faster ones), not below.
  ops::PackedLinear p(Tensor::randn({96, 128}, 43).to(DType::BF16));
  EXPECT_EQ(p.prefers_f32_gemms(), !ops::detail::bf16_gemm_native());
  p.set_prefers_f32_gemms(true);
  Tensor y64 = Tensor::empty({64, 96}), y63 = Tensor::empty({63, 96});
  EXPECT_EQ(ops::detail::linear_into_path(y64, Tensor::randn({64, 128}, 44), p, Tensor(), ops::detail::Bf16Path::Auto),
            ops::detail::Bf16Kernel::Paired);
  EXPECT_EQ(ops::detail::linear_into_path(y63, Tensor::randn({63, 128}, 44), p, Tensor(), ops::detail::Bf16Path::Auto),
            ops::detail::Bf16Kernel::OneDnn);
  p.set_prefers_f32_gemms(false);
  EXPECT_EQ(ops::detail::linear_into_path(y64, Tensor::randn({64, 128}, 44), p, Tensor(), ops::detail::Bf16Path::Auto),
            ops::detail::Bf16Kernel::OneDnn);
  // f32 weights and odd K never take it.
  ops::PackedLinear f32w(Tensor::randn({96, 128}, 45)), odd(Tensor::randn({96, 127}, 45).to(DType::BF16));
  EXPECT_EQ(
      ops::detail::linear_into_path(y64, Tensor::randn({64, 128}, 44), f32w, Tensor(), ops::detail::Bf16Path::Paired),
      ops::detail::Bf16Kernel::OneDnn);
  EXPECT_EQ(
      ops::detail::linear_into_path(y64, Tensor::randn({64, 127}, 44), odd, Tensor(), ops::detail::Bf16Path::Paired),
      ops::detail::Bf16Kernel::OneDnn);
}

TEST(Linear, DecodeBf16KernelGivesOneDnnBits) {
  // Decode's products of 1 to 16 rows may run bf16_gemv.h's kernel, which must give
  // oneDNN's bits: the probe finds oneDNN's K chunking per weight shape (a shape it
  // can't match keeps oneDNN, and then this test says so and checks nothing else).
  // Each row's bits are also its own one-row product's, whatever rows run beside it.
  if (!ops::detail::bf16_gemv_available()) GTEST_SKIP() << "no AVX512-BF16 here: oneDNN runs every decode product";
  // TP_GEMM=ordered and TP_BF16_GEMM=widen run inference products elsewhere (ordered_gemm, oneDNN's f32): no
  // oneDNN bf16 bits to give.
  if (ops::detail::ordered_gemm_wanted() || !ops::detail::bf16_matmul_available())
    GTEST_SKIP() << "TP_GEMM=ordered or TP_BF16_GEMM=widen: the decode products do not run oneDNN's bf16 kernel";
  if (ops::detail::bf16_gemm_forced_native()) {  // the user's switch keeps oneDNN
    ops::PackedLinear p(Tensor::randn({64, 96}, 60).to(DType::BF16));
    Tensor y = Tensor::empty({1, 64});
    EXPECT_EQ(ops::detail::linear_into_path(y, Tensor::randn({1, 96}, 61), p, Tensor(), ops::detail::Bf16Path::Auto),
              ops::detail::Bf16Kernel::OneDnn);
    GTEST_SKIP() << "TP_BF16_GEMM=native: oneDNN runs every decode product";
  }
  int64_t matched = 0;
  // K of one chunk, of 512-row chunks (768, 1024) and of 1024-row ones with a tail
  // (1536, 3072); the model's shapes; a tail panel.
  for (auto [k, n] : {std::pair<int64_t, int64_t>{96, 70},
                      {768, 130},
                      {1024, 3072},
                      {1024, 2048},
                      {1536, 64},
                      {3072, 1024},
                      {2048, 1000}}) {
    Tensor w = with_specials(Tensor::randn({n, k}, 60, 0.f, 0.05f), 5).to(DType::BF16), b = Tensor::randn({n}, 61);
    ops::PackedLinear p(w, /*keep_weight=*/false);
    for (int64_t m : {1, 2, 5, 7, 12, 16})
      for (bool bias : {false, true})
        for (DType xd : {DType::F32, DType::BF16}) {
          Tensor x = with_specials(Tensor::randn({m, k}, 62 + m, 0.f, 3.f), 62 + m);
          if (xd == DType::BF16) x = x.to(DType::BF16);
          Tensor native = Tensor::empty({m, n}), fast = Tensor::empty({m, n});
          ops::detail::linear_into_path(native, x, p, bias ? b : Tensor(), ops::detail::Bf16Path::Native);
          const auto kernel =
              ops::detail::linear_into_path(fast, x, p, bias ? b : Tensor(), ops::detail::Bf16Path::Auto);
          if (kernel != ops::detail::Bf16Kernel::Gemv) {
            ADD_FAILURE() << "no chunking matched oneDNN for " << m << " rows of [" << k << " x " << n << "]";
            continue;
          }
          ++matched;
          EXPECT_EQ(std::memcmp(native.raw_data(), fast.raw_data(), static_cast<size_t>(m * n) * sizeof(float)), 0)
              << m << " rows of " << k << "x" << n << " bias " << bias << " x " << dtype_name(xd);
          for (int64_t i : {int64_t{0}, m / 2, m - 1}) {
            Tensor alone = Tensor::empty({1, n});
            ops::detail::linear_into_path(alone, x.narrow(0, i, 1).clone(), p, bias ? b : Tensor(),
                                          ops::detail::Bf16Path::Auto);
            EXPECT_EQ(std::memcmp(alone.raw_data(), fast.data<float>() + i * n, static_cast<size_t>(n) * sizeof(float)),
                      0)
                << "row " << i << " of " << m << " against itself alone, " << k << "x" << n;
          }
        }
    Tensor many = Tensor::empty({17, n});
    EXPECT_NE(ops::detail::linear_into_path(many, Tensor::randn({17, k}, 64), p, Tensor(), ops::detail::Bf16Path::Auto),
              ops::detail::Bf16Kernel::Gemv);
  }
  EXPECT_GT(matched, 0);
}

TEST(Linear, DecodeBf16KernelPrefetchesOrNotWithTheSameBits) {
  // The kernel times its prefetching and its plain stream on a process's first large
  // one-row products and keeps the faster (bf16_gemv.h); every call in the trial, of
  // either kind, must give the same bits.
  if (!ops::detail::bf16_gemv_available() || ops::detail::ordered_gemm_wanted() ||
      !ops::detail::bf16_matmul_available() || ops::detail::bf16_gemm_forced_native())
    GTEST_SKIP() << "the decode kernel does not run here";
  const int64_t k = 1024, n = 2304;  // 4.5 MiB: above the trial's 4 MiB
  ops::PackedLinear p(Tensor::randn({n, k}, 70, 0.f, 0.05f).to(DType::BF16), /*keep_weight=*/false);
  Tensor x = Tensor::randn({1, k}, 71), first = Tensor::empty({1, n}), again = Tensor::empty({1, n});
  ASSERT_EQ(ops::detail::linear_into_path(first, x, p, Tensor(), ops::detail::Bf16Path::Auto),
            ops::detail::Bf16Kernel::Gemv);
  for (int i = 0; i < 40; ++i) {
    ops::detail::linear_into_path(again, x, p, Tensor(), ops::detail::Bf16Path::Auto);
    ASSERT_EQ(std::memcmp(first.raw_data(), again.raw_data(), static_cast<size_t>(n) * sizeof(float)), 0)
        << "call " << i << ", prefetch choice " << ops::detail::bf16_gemv_prefetch_choice();
  }
  EXPECT_NE(ops::detail::bf16_gemv_prefetch_choice(), -1) << "40 large one-row products and still undecided";
}
