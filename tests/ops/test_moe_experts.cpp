// The MoE kernels against naive per-token loops, and their backward against
// central differences: grouped experts (an expert with no tokens, the sentinel
// id skipped), GPT-OSS's layout (x @ W, interleaved gate/up, biases, clamped
// SwiGLU), the softmax top-k and top-k softmax routers, row gather and combine.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/op_test_util.h"
#include "tp/ops/moe_experts.h"
#include "tp/ops/ordered_gemm.h"
#include "tp/ops/quantized_linear.h"
#include "tp/tensor/random.h"

namespace tp::test {
namespace {

float silu(float v) { return v / (1.f + std::exp(-v)); }

// out[n] = sum_k w[n,k] * down[e] (silu(gate[e] x) * up[e] x), one token at a time.
std::vector<double> naive_experts(const Tensor& x, const std::vector<int64_t>& ids, const Tensor& w,
                                  const Tensor& gate_up, const Tensor& down) {
  const int64_t N = x.size(0), H = x.size(1), K = w.size(1), E = gate_up.size(0), I = gate_up.size(1) / 2;
  std::vector<float> xv = x.to_vector(), wv = w.to_vector(), gu = gate_up.to_vector(), dn = down.to_vector();
  std::vector<double> out(static_cast<size_t>(N * H), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = ids[n * K + k];
      if (e == E) continue;
      std::vector<float> a(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += gu[(e * 2 * I + i) * H + h] * xv[n * H + h];
          u += gu[(e * 2 * I + I + i) * H + h] * xv[n * H + h];
        }
        a[i] = silu(static_cast<float>(g)) * static_cast<float>(u);
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += dn[(e * H + h) * I + i] * a[i];
        out[n * H + h] += wv[n * K + k] * y;
      }
    }
  return out;
}

// 5 tokens, top-2 of 4 experts: expert 3 gets no token, expert 0 gets four, one slot is the sentinel (4).
const std::vector<int64_t> kIds = {0, 1, 0, 2, 1, 0, 4, 0, 2, 1};

TEST(MoeExperts, EqualsTokenByTokenExpertsIncludingEmptyExpertsAndTheSentinel) {
  Tensor x = Tensor::randn({5, 6}, 1), w = Tensor::rand({5, 2}, 2), gu = Tensor::randn({4, 8, 6}, 3, 0.f, 0.5f),
         dn = Tensor::randn({4, 6, 4}, 4, 0.f, 0.5f);
  Tensor ids = Tensor::from_ints(kIds, {5, 2});
  EXPECT_TRUE(close(ops::moe_experts(x, ids, w, gu, dn), naive_experts(x, kIds, w, gu, dn), 1e-5, 1e-5));
  // bf16 weights: the same sums of bf16 products (inputs rounded to bf16 by the GEMM).
  Tensor gu16 = gu.to(DType::BF16), dn16 = dn.to(DType::BF16);
  EXPECT_TRUE(close(ops::moe_experts(x, ids, w, gu16, dn16),
                    naive_experts(x, kIds, w, gu16.to(DType::F32), dn16.to(DType::F32)), 5e-2, 2e-2));
}

TEST(MoeExperts, GradientsMatchCentralDifferences) {
  Tensor ids = Tensor::from_ints(kIds, {5, 2});
  TP_EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return ops::moe_experts(in[0], ids, in[1], in[2], in[3]); },
      {param({5, 6}, 11), param({5, 2}, 12), param({4, 8, 6}, 13, 0.5f), param({4, 6, 4}, 14, 0.5f)});
}

TEST(MoeExperts, BadIdsAndShapesAreErrors) {
  Tensor x = Tensor::randn({2, 6}, 1), w = Tensor::rand({2, 1}, 2), gu = Tensor::randn({4, 8, 6}, 3),
         dn = Tensor::randn({4, 6, 4}, 4);
  expect_error([&] { ops::moe_experts(x, Tensor::from_ints({0, 5}, {2, 1}), w, gu, dn); },
               {"expert id 5 (token 1, slot 0) is outside [0, 4]"});
  expect_error([&] { ops::moe_experts(x, Tensor::from_ints({0, 1}, {2, 1}), w, gu, Tensor::randn({4, 6, 3}, 5)); },
               {"down_proj must be [4, 6, 4]"});
}

// GPT-OSS: gu = x W[e] + b[e] (W [H, 2I]), gate = gu[0::2] <= limit, up = gu[1::2] in [-limit, limit],
// y = ((up + 1) gate sigmoid(alpha gate)) Wd[e] + bd[e] (Wd [I, H]).
std::vector<double> naive_gpt_oss_experts(const Tensor& x, const std::vector<int64_t>& ids, const Tensor& w,
                                          const Tensor& gate_up, const Tensor& gub, const Tensor& down,
                                          const Tensor& db, double limit, double alpha) {
  const int64_t N = x.size(0), H = x.size(1), K = w.size(1), E = gate_up.size(0), I = gate_up.size(2) / 2;
  std::vector<float> xv = x.to_vector(), wv = w.to_vector(), gu = gate_up.to_vector(), dn = down.to_vector(),
                     bu = gub.to_vector(), bd = db.to_vector();
  std::vector<double> out(static_cast<size_t>(N * H), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = ids[n * K + k];
      if (e == E) continue;
      std::vector<double> a(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = bu[e * 2 * I + 2 * i], u = bu[e * 2 * I + 2 * i + 1];
        for (int64_t h = 0; h < H; ++h) {
          g += gu[(e * H + h) * 2 * I + 2 * i] * xv[n * H + h];
          u += gu[(e * H + h) * 2 * I + 2 * i + 1] * xv[n * H + h];
        }
        g = std::min(g, limit);
        u = std::clamp(u, -limit, limit);
        a[i] = (u + 1) * g / (1 + std::exp(-alpha * g));
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = bd[e * H + h];
        for (int64_t i = 0; i < I; ++i) y += dn[(e * I + i) * H + h] * a[i];
        out[n * H + h] += wv[n * K + k] * y;
      }
    }
  return out;
}

ops::ExpertOptions gpt_oss_options(const Tensor& gub, const Tensor& db, float limit) {
  ops::ExpertOptions o = ops::ExpertOptions::gpt_oss(limit, 1.702f);
  o.gate_up_bias = gub;
  o.down_bias = db;
  return o;
}

TEST(MoeExperts, GptOssLayoutEqualsTokenByTokenExperts) {
  // A limit of 1 clamps some gates and ups (values around +-1.5).
  Tensor x = Tensor::randn({5, 6}, 1), w = Tensor::rand({5, 2}, 2), gu = Tensor::randn({4, 6, 8}, 3, 0.f, 0.6f),
         gub = Tensor::randn({4, 8}, 5, 0.f, 0.5f), dn = Tensor::randn({4, 4, 6}, 4, 0.f, 0.5f),
         db = Tensor::randn({4, 6}, 6, 0.f, 0.5f);
  Tensor ids = Tensor::from_ints(kIds, {5, 2});
  for (float limit : {1.f, 7.f})
    EXPECT_TRUE(close(ops::moe_experts(x, ids, w, gu, dn, gpt_oss_options(gub, db, limit)),
                      naive_gpt_oss_experts(x, kIds, w, gu, gub, dn, db, limit, 1.702), 1e-5, 1e-5))
        << "limit " << limit;
  // Without the down bias (the ranks that leave it to rank 0): the same minus the weighted biases.
  ops::ExpertOptions no_bias = gpt_oss_options(gub, db, 7.f);
  no_bias.add_down_bias = false;
  EXPECT_TRUE(close(ops::moe_experts(x, ids, w, gu, dn, no_bias),
                    naive_gpt_oss_experts(x, kIds, w, gu, gub, dn, Tensor::zeros({4, 6}), 7.f, 1.702), 1e-5, 1e-5));
  expect_error([&] { ops::moe_experts(x, ids, w, gu, dn, gpt_oss_options(Tensor::zeros({4, 6}), db, 7.f)); },
               {"gate_up_proj_bias must be [4, 8]", "[4, 6]"});
  expect_error([&] { ops::moe_experts(x, ids, w, gu, Tensor::randn({4, 6, 4}, 7), gpt_oss_options(gub, db, 7.f)); },
               {"down_proj must be [4, 4, 6]"});
}

TEST(MoeExperts, GptOssGradientsMatchCentralDifferences) {
  // A limit of 0.8 clamps a good part of the gates and ups (values around +-1), none
  // of them within a difference step of the limit, where the derivative jumps.
  Tensor ids = Tensor::from_ints(kIds, {5, 2});
  TP_EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        return ops::moe_experts(in[0], ids, in[1], in[2], in[3], gpt_oss_options(in[4], in[5], 0.8f));
      },
      {param({5, 6}, 11), param({5, 2}, 12), param({4, 6, 8}, 13, 0.4f), param({4, 4, 6}, 14, 0.5f),
       param({4, 8}, 15, 0.3f), param({4, 6}, 16, 0.5f)});
}

// Where inference runs ordered_gemm (an AVX2-only CPU, or TP_GEMM=ordered: the
// test_ops_ordered run), a token's output is the same bits whatever other tokens
// chose its experts: what batched decode and serving rely on.
TEST(MoeExperts, ATokenGetsItsBitsAloneWhereOrderedGemmRuns) {
  if (!ops::detail::ordered_gemm_wanted()) GTEST_SKIP() << "oneDNN's brgemm runs here (test_ops_ordered forces it)";
  const int64_t N = 9, H = 72, I = 40, E = 4;
  std::vector<int64_t> route;
  for (int64_t n = 0; n < N; ++n) route.insert(route.end(), {n % E, (n * 3 + 1) % E});
  Tensor x = Tensor::randn({N, H}, 1), w = Tensor::rand({N, 2}, 2), ids = Tensor::from_ints(route, {N, 2});
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool gpt_oss : {false, true}) {
      Tensor gu = Tensor::randn(gpt_oss ? Shape{E, H, 2 * I} : Shape{E, 2 * I, H}, 3, 0.f, 0.2f).to(dtype);
      Tensor dn = Tensor::randn(gpt_oss ? Shape{E, I, H} : Shape{E, H, I}, 4, 0.f, 0.2f).to(dtype);
      const ops::ExpertOptions o = gpt_oss ? gpt_oss_options(Tensor::randn({E, 2 * I}, 5), Tensor::randn({E, H}, 6), 7.f)
                                           : ops::ExpertOptions{};
      Tensor all = ops::moe_experts(x, ids, w, gu, dn, o);
      for (int64_t n = 0; n < N; ++n) {
        Tensor alone = ops::moe_experts(x.narrow(0, n, 1), ids.narrow(0, n, 1), w.narrow(0, n, 1), gu, dn, o);
        EXPECT_EQ(std::memcmp(alone.raw_data(), all.narrow(0, n, 1).raw_data(), alone.nbytes()), 0)
            << dtype_name(dtype) << (gpt_oss ? " gpt-oss layout" : "") << " token " << n;
      }
    }
}

// Packed experts (quantized checkpoints, MXFP4) give the experts of their dequantized weights: with up to 48 rows
// an expert (decode's kernels, x quantized to 16 bits where AVX512-VNNI is: within 2e-3 at these weights' size)
// and more (prefill's GEMM: within f32 rounding, or in bf16 arithmetic with packed_compute bf16, as the same
// experts held in bf16 compute); gate_up as one weight, or gate and up apart.
TEST(MoeExperts, PackedExpertsEqualTheirDequantizedWeights) {
  const int64_t E = 2, H = 64, I = 32;
  uint64_t seed = 7;
  // MXFP4 codes and exponents of an [n, k] weight.
  auto codes = [&](int64_t n, int64_t k) {
    Tensor c = Tensor::empty({n, k}, DType::U8);
    for (int64_t i = 0; i < n * k; ++i) c.data<uint8_t>()[i] = static_cast<uint8_t>(mix64(++seed) % 16);
    return c;
  };
  auto exponents = [&](int64_t n, int64_t k) {
    Tensor x = Tensor::empty({n, k / 32}, DType::U8);
    for (int64_t i = 0; i < n * k / 32; ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(122 + mix64(++seed) % 4);
    return x;
  };
  std::vector<ops::QuantizedLinear> gate_up, gate, up, down;
  Tensor gu = Tensor::empty({E, 2 * I, H}), dn = Tensor::empty({E, H, I});
  for (int64_t e = 0; e < E; ++e) {
    const Tensor c = codes(2 * I, H), x = exponents(2 * I, H);  // gate's rows, then up's
    gate_up.push_back(ops::QuantizedLinear::e2m1(c, x));
    gate.push_back(ops::QuantizedLinear::e2m1(c.narrow(0, 0, I), x.narrow(0, 0, I)));
    up.push_back(ops::QuantizedLinear::e2m1(c.narrow(0, I, I), x.narrow(0, I, I)));
    down.push_back(ops::QuantizedLinear::e2m1(codes(H, I), exponents(H, I)));
    const Tensor w = gate_up.back().dequantize(), d = down.back().dequantize();
    std::memcpy(gu.data<float>() + e * 2 * I * H, w.data<float>(), w.nbytes());
    std::memcpy(dn.data<float>() + e * H * I, d.data<float>(), d.nbytes());
  }
  for (int64_t n : {3, 24, 60, 130}) {
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int64_t>(mix64(100 + t) % E);
    const Tensor x = Tensor::randn({n, H}, 11 + n), w = Tensor::rand({n, 1}, 12 + n);
    const Tensor id = Tensor::from_ints(ids, {n, 1});
    const std::vector<double> want = naive_experts(x, ids, w, gu, dn);
    ops::ExpertOptions fused, apart;
    fused.packed_gate_up = &gate_up;
    fused.packed_down = apart.packed_down = &down;
    apart.packed_gate_up = &gate;
    apart.packed_up = &up;
    // 130 tokens give each expert ~65 rows: prefill's f32 GEMM over the dequantized weights, f32 rounding only.
    // Fewer: decode's kernels, within 1e-4 of the outputs' scale (measured: 4.6e-5 to 7.4e-5 of it).
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    const double atol = n == 130 ? 1e-5 : 1e-4 * scale, rtol = n == 130 ? 1e-5 : 0;
    EXPECT_TRUE(close(ops::moe_experts(x, id, w, Tensor(), Tensor(), fused), want, atol, rtol)) << n << " tokens";
    EXPECT_TRUE(close(ops::moe_experts(x, id, w, Tensor(), Tensor(), apart), want, atol, rtol)) << n << " tokens";
    if (n != 130) continue;
    // A bf16 model's: MXFP4 values are bf16 values, so the same experts held in bf16 give the same products
    // (rounding x to bf16 moves these outputs ~1e-3, f32 against bf16 arithmetic).
    const Tensor bf16_experts = ops::moe_experts(x, id, w, gu.to(DType::BF16), dn.to(DType::BF16));
    fused.packed_compute = apart.packed_compute = DType::BF16;
    EXPECT_TRUE(close(ops::moe_experts(x, id, w, Tensor(), Tensor(), fused), bf16_experts, 1e-5, 1e-5));
    EXPECT_TRUE(close(ops::moe_experts(x, id, w, Tensor(), Tensor(), apart), bf16_experts, 1e-5, 1e-5));
    EXPECT_FALSE(close(bf16_experts, want, 1e-4, 1e-4)) << "the bf16 check would not see f32 arithmetic";
  }
}

// A quantized checkpoint's experts (4-bit codes in groups of 32): an expert's prompt rows take decode's kernels up
// to the weight's decode_rows_limit (where the integer kernels run, 48: ~30 rows an expert here) and prefill's
// GEMM above it (~100), each within its kernels' bound of the dequantized experts.
TEST(MoeExperts, AnExpertsFewPromptRowsTakeDecodesKernels) {
  const int64_t E = 2, H = 64, I = 32, G = 32;
  uint64_t seed = 40;
  auto quantized = [&](int64_t n, int64_t k) {
    Tensor codes = Tensor::empty({n, k}, DType::U8), zeros = Tensor::empty({n, k / G}, DType::U8);
    Tensor scales = Tensor::empty({n, k / G});
    for (int64_t i = 0; i < n * k; ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(mix64(++seed) % 16);
    for (int64_t i = 0; i < n * k / G; ++i) {
      zeros.data<uint8_t>()[i] = static_cast<uint8_t>(mix64(++seed) % 16);
      scales.data<float>()[i] = 0.01f + 0.02f * static_cast<float>(mix64(++seed) % 100) / 100.f;
    }
    return ops::QuantizedLinear(4, G, codes, scales, zeros);
  };
  std::vector<ops::QuantizedLinear> gate_up, down;
  Tensor gu = Tensor::empty({E, 2 * I, H}), dn = Tensor::empty({E, H, I});
  for (int64_t e = 0; e < E; ++e) {
    gate_up.push_back(quantized(2 * I, H));
    down.push_back(quantized(H, I));
    const Tensor w = gate_up.back().dequantize(), d = down.back().dequantize();
    std::memcpy(gu.data<float>() + e * 2 * I * H, w.data<float>(), w.nbytes());
    std::memcpy(dn.data<float>() + e * H * I, d.data<float>(), d.nbytes());
  }
  const int64_t limit = gate_up[0].decode_rows_limit();
  ASSERT_EQ(limit, down[0].decode_rows_limit());
  ops::ExpertOptions o;
  o.packed_gate_up = &gate_up;
  o.packed_down = &down;
  for (int64_t n : {60, 200}) {
    std::vector<int64_t> ids(static_cast<size_t>(n));
    int64_t most = 0;
    for (int64_t e = 0; e < E; ++e) {
      int64_t rows = 0;
      for (int64_t t = 0; t < n; ++t) rows += (ids[t] = static_cast<int64_t>(mix64(300 + t) % E)) == e;
      most = std::max(most, rows);
    }
    const Tensor x = Tensor::randn({n, H}, 50 + n), w = Tensor::rand({n, 1}, 51 + n);
    const std::vector<double> want = naive_experts(x, ids, w, gu, dn);
    const ops::detail::QuantizedRows before = ops::detail::quantized_rows_so_far();
    const Tensor got = ops::moe_experts(x, Tensor::from_ints(ids, {n, 1}), w, Tensor(), Tensor(), o);
    const ops::detail::QuantizedRows after = ops::detail::quantized_rows_so_far();
    const bool few = most <= limit;
    if (n == 60 && ops::detail::quantized_decode_kernel(1) == ops::detail::QuantizedKernel::Avx512Vnni)
      EXPECT_TRUE(few) << "the integer kernels' lane panels take " << most << " rows (limit " << limit << ")";
    EXPECT_EQ(after.decode - before.decode, few ? 2 * n : 0) << n << " tokens, at most " << most << " an expert";
    EXPECT_EQ(after.prefill > before.prefill, !few) << n << " tokens, at most " << most << " an expert";
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    EXPECT_TRUE(close(got, want, few ? 1e-4 * scale : 1e-5, few ? 0 : 1e-5)) << n << " tokens";
  }
}

TEST(TopKSoftmax, PicksTheLargestLogitsThenTakesTheSoftmaxOfThem) {
  Tensor logits = Tensor::from_vector({0.1f, 2.f, -1.f, 1.f, /**/ 3.f, 0.f, 0.5f, 2.5f}, {2, 4});
  ops::TopK t = ops::top_k_softmax(logits, 2);
  EXPECT_EQ(t.ids.to_int_vector(), (std::vector<int64_t>{1, 3, 0, 3}));
  const double a = 1 / (1 + std::exp(1.0 - 2.0)), b = 1 / (1 + std::exp(2.5 - 3.0));
  EXPECT_TRUE(close(t.weights, {a, 1 - a, b, 1 - b}, 1e-6));
  expect_error([&] { ops::top_k_softmax(logits, 0); }, {"top_k 0 must be in [1, 4]"});
  TP_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::top_k_softmax(in[0], 3).weights; },
                      {param({4, 6}, 22)});
}

TEST(SoftmaxTopK, PicksTheLargestProbabilitiesAndRenormalises) {
  Tensor logits = Tensor::from_vector({0.1f, 2.f, -1.f, 1.f, /**/ 3.f, 0.f, 0.5f, 2.5f}, {2, 4});
  for (bool renorm : {false, true}) {
    ops::TopK t = ops::softmax_top_k(logits, 2, renorm);
    EXPECT_EQ(t.ids.to_int_vector(), (std::vector<int64_t>{1, 3, 0, 3}));
    std::vector<double> want;
    for (int64_t n = 0; n < 2; ++n) {
      double z = 0;
      for (int64_t e = 0; e < 4; ++e) z += std::exp(logits.at(n * 4 + e));
      const double a = std::exp(logits.at(n * 4 + (n == 0 ? 1 : 0))) / z, b = std::exp(logits.at(n * 4 + 3)) / z;
      want.push_back(renorm ? a / (a + b) : a);
      want.push_back(renorm ? b / (a + b) : b);
    }
    EXPECT_TRUE(close(t.weights, want, 1e-6)) << "renormalize " << renorm;
  }
  expect_error([&] { ops::softmax_top_k(logits, 5, true); }, {"top_k 5 must be in [1, 4]"});
}

TEST(SoftmaxTopK, GradientsMatchCentralDifferences) {
  for (bool renorm : {false, true})
    TP_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::softmax_top_k(in[0], 3, renorm).weights; },
                        {param({4, 6}, 21)});
}

TEST(RouteTopK, GroupLimitedAndBiasedChoicesAsDeepSeekComputes) {
  // 4 experts in 2 groups {0, 1}, {2, 3}.
  Tensor logits = Tensor::from_vector({2.f, -3.f, 1.5f, 1.4f}, {1, 4});
  // V2 group_limited_greedy: a group scores its max (2 > 1.5), so top-2 within {0, 1}; weights x 2.
  ops::TopK v2 = ops::route_top_k(logits, {.top_k = 2, .renormalize = false, .n_group = 2, .topk_group = 1, .scaling = 2});
  EXPECT_EQ(v2.ids.to_int_vector(), (std::vector<int64_t>{0, 1}));
  double z = 0;
  for (float l : {2.f, -3.f, 1.5f, 1.4f}) z += std::exp(l);
  EXPECT_TRUE(close(v2.weights, {2 * std::exp(2.0) / z, 2 * std::exp(-3.0) / z}, 1e-6));
  // V3 noaux_tc: a group scores the sum of its top-2 choices, so {2, 3} wins; the
  // bias only chooses (3 over 2), the weights are the unbiased sigmoids, renormalised.
  Tensor bias = Tensor::from_vector({0.f, 0.f, -0.5f, 0.f}, {4});
  ops::TopK v3 = ops::route_top_k(
      logits, {.top_k = 1, .renormalize = false, .sigmoid = true, .n_group = 2, .topk_group = 1, .group_sum_top2 = true},
      bias);
  EXPECT_EQ(v3.ids.to_int_vector(), (std::vector<int64_t>{3}));
  EXPECT_TRUE(close(v3.weights, {1 / (1 + std::exp(-1.4))}, 1e-6));
  expect_error([&] { ops::route_top_k(logits, {.top_k = 3, .n_group = 2, .topk_group = 1}); },
               {"top_k 3 is more than the 2 experts of the topk_group 1 kept groups"});
}

TEST(RouteTopK, GradientsMatchCentralDifferences) {
  for (bool sigmoid : {false, true})
    for (bool renorm : {false, true})
      TP_EXPECT_GRADCHECK(
          [&](const std::vector<Tensor>& in) {
            return ops::route_top_k(in[0], {.top_k = 2, .renormalize = renorm, .sigmoid = sigmoid, .n_group = 3,
                                            .topk_group = 2, .group_sum_top2 = sigmoid, .scaling = 1.5})
                .weights;
          },
          {param({4, 6}, 22)});
}

TEST(RowsGatherAndCombine, GradientsMatchCentralDifferences) {
  const std::vector<int64_t> rows = {2, 0, 2, 1};
  TP_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::gather_rows(in[0], rows); },
                      {param({3, 5}, 31)});
  TP_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::combine_rows(in[0], rows, in[1], 3); },
                      {param({4, 5}, 32), param({4}, 33)});
  // The routed biases: slot weights times their expert's row, the sentinel (4) skipped.
  Tensor bias = Tensor::from_vector({1, 2, 10, 20, 100, 200, 0, 0}, {4, 2});
  Tensor ids = Tensor::from_ints({0, 2, 1, 4}, {2, 2}), w = Tensor::from_vector({0.5, 0.25, 2, 3}, {2, 2});
  EXPECT_TRUE(close(ops::routed_bias(ids, w, bias), {25.5, 51, 20, 40}, 1e-6));
  TP_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::routed_bias(ids, in[0], in[1]); },
                      {param({2, 2}, 34), param({4, 2}, 35)});
  Tensor y = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  EXPECT_TRUE(close(ops::combine_rows(y, {1, 1}, Tensor::from_vector({2, 0.5}, {2}), 2), {0, 0, 3.5, 6}, 0));
}

}  // namespace
}  // namespace tp::test
