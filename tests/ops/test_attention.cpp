// Attention against a naive reference (GQA, causal offsets, per-sequence lengths),
// its gradients (the GEMM backward against the same reference), bf16 compute
// against f32, and the KV cache (prefill + token-by-token decode == one pass).
#include <omp.h>

#include <cmath>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/ops/attention.h"
#include "tp/ops/vec.h"
#include "tp/tensor/convert.h"

using namespace tp;
using namespace tp::test;

namespace {

// Straight from the definition, in double: calls row(qi, keys, p) for every query
// row that sees a key, with qi its offset in q, keys the offsets in k and v of the
// keys it sees, p their probabilities.
template <class Row>
void for_each_query_row(const Tensor& q, const Tensor& k, const ops::AttentionOptions& opt, Row row) {
  int64_t b = q.size(0), tq = q.size(1), hq = q.size(2), d = q.size(3), tk = k.size(1), hkv = k.size(2);
  std::vector<float> qv = q.to_vector(), kv = k.to_vector();
  double scale = opt.scale != 0 ? opt.scale : 1 / std::sqrt(static_cast<double>(d));
  for (int64_t s = 0; s < b; ++s) {
    int64_t len = opt.kv_lens.empty() ? tk : opt.kv_lens[s];
    int64_t off = opt.q_offsets.empty() ? tk - tq : opt.q_offsets[s];
    for (int64_t h = 0; h < hq; ++h) {
      int64_t kh = h / (hq / hkv);
      for (int64_t i = 0; i < tq; ++i) {
        const int64_t qi = ((s * tq + i) * hq + h) * d;
        std::vector<int64_t> keys;
        std::vector<double> p;
        for (int64_t j = 0; j < std::min(len, tk); ++j) {
          if (opt.causal && j > off + i) break;
          const int64_t kj = ((s * tk + j) * hkv + kh) * d;
          double sc = 0;
          for (int64_t c = 0; c < d; ++c) sc += static_cast<double>(qv[qi + c]) * kv[kj + c];
          keys.push_back(kj);
          p.push_back(sc * scale);
        }
        if (keys.empty()) continue;  // no visible key: zeros
        double mx = -INFINITY, tot = 0;
        for (double x : p) mx = std::max(mx, x);
        for (double& x : p) tot += (x = std::exp(x - mx));
        for (double& x : p) x /= tot;
        row(qi, keys, p);
      }
    }
  }
}

std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const ops::AttentionOptions& opt) {
  const int64_t d = q.size(3);
  std::vector<float> vv = v.to_vector();
  std::vector<double> out(static_cast<size_t>(q.numel()), 0.0);
  for_each_query_row(q, k, opt, [&](int64_t qi, const std::vector<int64_t>& keys, const std::vector<double>& p) {
    for (size_t j = 0; j < keys.size(); ++j)
      for (int64_t c = 0; c < d; ++c) out[qi + c] += p[j] * vv[keys[j] + c];
  });
  return out;
}

struct NaiveGrads {
  std::vector<double> dq, dk, dv;
};

// Per query row, with P its probabilities: dP_j = dO . v_j;  dS_j = P_j (dP_j - sum_j P_j dP_j);
// dq = scale sum_j dS_j k_j;  dk_j += scale dS_j q;  dv_j += P_j dO.
NaiveGrads naive_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                    const ops::AttentionOptions& opt) {
  const int64_t d = q.size(3);
  std::vector<float> qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector(), gv = dout.to_vector();
  double scale = opt.scale != 0 ? opt.scale : 1 / std::sqrt(static_cast<double>(d));
  NaiveGrads r{std::vector<double>(qv.size()), std::vector<double>(kv.size()), std::vector<double>(vv.size())};
  for_each_query_row(q, k, opt, [&](int64_t qi, const std::vector<int64_t>& keys, const std::vector<double>& p) {
    std::vector<double> dp(keys.size());
    double dot = 0;
    for (size_t j = 0; j < keys.size(); ++j) {
      for (int64_t c = 0; c < d; ++c) dp[j] += static_cast<double>(gv[qi + c]) * vv[keys[j] + c];
      dot += p[j] * dp[j];
    }
    for (size_t j = 0; j < keys.size(); ++j) {
      double ds = p[j] * (dp[j] - dot) * scale;
      for (int64_t c = 0; c < d; ++c) {
        r.dq[qi + c] += ds * kv[keys[j] + c];
        r.dk[keys[j] + c] += ds * qv[qi + c];
        r.dv[keys[j] + c] += p[j] * gv[qi + c];
      }
    }
  });
  return r;
}

// |got - want| <= tol * max |want| everywhere: relative to the gradient's scale, as
// a few of its elements are sums that cancel to nearly zero.
::testing::AssertionResult close_to_scale(const Tensor& got, const std::vector<double>& want, double tol) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  return close(got, want, tol * scale);
}

::testing::AssertionResult close_to_scale(const Tensor& got, const Tensor& want, double tol) {
  std::vector<float> w = want.to_vector();
  return close_to_scale(got, std::vector<double>(w.begin(), w.end()), tol);
}

struct BackwardCase {
  const char* name;
  int64_t b, tq, tk, hq, hkv, d;
  ops::AttentionOptions opt;
};

// GQA groups 1, 2 and 4; lengths not a multiple of a block (in stacked rows: 128 /
// group queries); cache continuation (Tq < Tk, q_offsets); padding (kv_lens); a
// query with no visible key; decode-sized Tq; no mask.
std::vector<BackwardCase> backward_cases() {
  std::vector<BackwardCase> cases{
      {"mha, two blocks", 1, 150, 150, 3, 3, 16, {}},
      {"group 2, training-like", 2, 70, 70, 4, 2, 32, {}},
      {"group 4, lengths", 2, 45, 45, 8, 2, 8, {}},
      {"continuation", 2, 20, 50, 4, 2, 16, {}},
      {"no visible key", 2, 40, 40, 4, 1, 8, {}},
      {"decode-sized", 2, 3, 12, 4, 2, 8, {}},
      {"not causal", 2, 33, 40, 2, 1, 8, {}},
  };
  cases[2].opt.kv_lens = {45, 30};
  cases[3].opt.q_offsets = {30, 10};
  cases[3].opt.kv_lens = {50, 27};
  cases[4].opt.q_offsets = {-3, 0};  // sequence 0's first three queries see nothing
  cases[4].opt.scale = 0.3;
  cases[5].opt.q_offsets = {9, 4};
  cases[6].opt.causal = false;
  cases[6].opt.kv_lens = {40, 17};
  return cases;
}

}  // namespace

TEST(Attention, MatchesNaiveWithGqaOffsetsAndLengths) {
  Tensor q = Tensor::randn({2, 3, 4, 5}, 1), k = Tensor::randn({2, 6, 2, 5}, 2), v = Tensor::randn({2, 6, 2, 5}, 3);
  std::vector<ops::AttentionOptions> cases(5);
  cases[1].kv_lens = {6, 4};
  cases[1].q_offsets = {3, 1};
  cases[2].causal = false;
  cases[2].kv_lens = {2, 5};
  cases[3].scale = 0.7;
  cases[4].q_offsets = {-1, 0};  // sequence 0's query 0 sees no key: zeros, not NaN
  for (size_t c = 0; c < cases.size(); ++c)
    EXPECT_TRUE(close(ops::attention(q, k, v, cases[c]), naive_attention(q, k, v, cases[c]), 1e-5, 1e-5))
        << "case " << c;
  // Single query row, one head; and an empty batch.
  Tensor q1 = Tensor::randn({1, 1, 1, 3}, 4), k1 = Tensor::randn({1, 1, 1, 3}, 5);
  EXPECT_TRUE(close(ops::attention(q1, k1, k1), k1, 1e-6));  // one key: output = its value
  EXPECT_EQ(ops::attention(Tensor::zeros({0, 2, 2, 4}), Tensor::zeros({0, 2, 1, 4}), Tensor::zeros({0, 2, 1, 4}))
                .shape(),
            (Shape{0, 2, 2, 4}));
}

TEST(Attention, LongQueriesTakeTheGemmPathAndMatchNaive) {
  // 70 query rows: two blocks of the GEMM prefill path, GQA 4:2, lengths and offsets.
  Tensor q = Tensor::randn({2, 70, 4, 8}, 11), k = Tensor::randn({2, 80, 2, 8}, 12), v = Tensor::randn({2, 80, 2, 8}, 13);
  std::vector<ops::AttentionOptions> cases(3);
  cases[1].kv_lens = {80, 33};
  cases[1].q_offsets = {10, -5};  // sequence 1: the first rows see nothing
  cases[2].causal = false;
  cases[2].kv_lens = {17, 80};
  for (size_t c = 0; c < cases.size(); ++c)
    EXPECT_TRUE(close(ops::attention(q, k, v, cases[c]), naive_attention(q, k, v, cases[c]), 1e-5, 1e-4))
        << "case " << c;
}

TEST(Attention, Gradcheck) {
  ops::AttentionOptions opt;
  opt.kv_lens = {4, 3};
  opt.q_offsets = {1, 0};
  auto fn = [opt](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], opt); };
  TP_EXPECT_GRADCHECK(fn, {param({2, 3, 4, 3}, 1), param({2, 4, 2, 3}, 2), param({2, 4, 2, 3}, 3)});
}

TEST(Attention, BackwardMatchesNaive) {
  for (const BackwardCase& c : backward_cases()) {
    Tensor q = Tensor::randn({c.b, c.tq, c.hq, c.d}, 1), k = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 2),
           v = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 3), dout = Tensor::randn({c.b, c.tq, c.hq, c.d}, 4);
    NaiveGrads want = naive_attention_backward(q, k, v, dout, c.opt);
    ops::AttentionGrads got = ops::attention_backward(q, k, v, dout, c.opt);
    EXPECT_TRUE(close_to_scale(got.dq, want.dq, 1e-5)) << c.name << ": dq";
    EXPECT_TRUE(close_to_scale(got.dk, want.dk, 1e-5)) << c.name << ": dk";
    EXPECT_TRUE(close_to_scale(got.dv, want.dv, 1e-5)) << c.name << ": dv";
  }
}

TEST(Attention, RecordedBackwardIsAttentionBackward) {
  const BackwardCase c = backward_cases()[3];
  Tensor q = param({c.b, c.tq, c.hq, c.d}, 1), k = param({c.b, c.tk, c.hkv, c.d}, 2),
         v = param({c.b, c.tk, c.hkv, c.d}, 3), dout = Tensor::randn({c.b, c.tq, c.hq, c.d}, 4);
  for (DType compute : {DType::F32, DType::BF16}) {
    ops::AttentionOptions opt = c.opt;
    opt.compute_dtype = compute;
    autograd::backward(ops::attention(q, k, v, opt), dout);
    ops::AttentionGrads want = ops::attention_backward(q, k, v, dout, opt);
    EXPECT_TRUE(equal(q.grad(), want.dq) && equal(k.grad(), want.dk) && equal(v.grad(), want.dv))
        << dtype_name(compute);
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  }
}

TEST(Attention, BackwardIsDeterministic) {
  // Two kv heads' tasks on two threads (dynamic schedule): the same bits every run,
  // and for one thread as for two (a task is one thread's, in a fixed order).
  Tensor q = Tensor::randn({2, 130, 4, 32}, 1), k = Tensor::randn({2, 130, 2, 32}, 2),
         v = Tensor::randn({2, 130, 2, 32}, 3), dout = Tensor::randn({2, 130, 4, 32}, 4);
  for (DType compute : {DType::F32, DType::BF16}) {
    ops::AttentionOptions opt;
    opt.compute_dtype = compute;
    omp_set_num_threads(2);
    ops::AttentionGrads a = ops::attention_backward(q, k, v, dout, opt);
    ops::AttentionGrads b = ops::attention_backward(q, k, v, dout, opt);
    omp_set_num_threads(1);
    ops::AttentionGrads c = ops::attention_backward(q, k, v, dout, opt);
    for (const ops::AttentionGrads* x : {&b, &c})
      EXPECT_TRUE(equal(a.dq, x->dq) && equal(a.dk, x->dk) && equal(a.dv, x->dv)) << dtype_name(compute) << (x == &b ? " run to run" : " 1 vs 2 threads");
  }
}

TEST(Attention, Bf16ComputeIsCloseToF32) {
  // bf16 operands carry 8 bits of mantissa: products off by ~2^-9 relative, summed
  // over D and the keys in f32. Scale-relative 2e-2 is a few times what they give.
  for (const BackwardCase& c : backward_cases()) {
    Tensor q = Tensor::randn({c.b, c.tq, c.hq, c.d}, 1), k = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 2),
           v = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 3), dout = Tensor::randn({c.b, c.tq, c.hq, c.d}, 4);
    ops::AttentionOptions opt = c.opt;
    ops::AttentionGrads want = ops::attention_backward(q, k, v, dout, opt);
    Tensor want_out = ops::attention(q, k, v, opt);
    opt.compute_dtype = DType::BF16;
    ops::AttentionGrads got = ops::attention_backward(q, k, v, dout, opt);
    EXPECT_TRUE(close_to_scale(ops::attention(q, k, v, opt), want_out, 1e-2)) << c.name << ": out";
    EXPECT_TRUE(close_to_scale(got.dq, want.dq, 2e-2)) << c.name << ": dq";
    EXPECT_TRUE(close_to_scale(got.dk, want.dk, 2e-2)) << c.name << ": dk";
    EXPECT_TRUE(close_to_scale(got.dv, want.dv, 2e-2)) << c.name << ": dv";
    EXPECT_FALSE(equal(got.dq, want.dq)) << c.name << ": bf16 compute changed nothing";
  }
}

TEST(Attention, Bf16ComputeForwardRoundsOperandsOnTheGemmPath) {
  // The GEMM forward in bf16 equals f32 attention over q, k and v rounded to bf16,
  // up to P's rounding; with a bf16 cache too (its keys used as they are). The
  // decode path (Tq < 16) computes in f32 whatever compute_dtype says.
  Tensor q = Tensor::randn({2, 40, 4, 16}, 1), k = Tensor::randn({2, 48, 2, 16}, 2), v = Tensor::randn({2, 48, 2, 16}, 3);
  auto round = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F32); };
  ops::AttentionOptions opt;
  opt.kv_lens = {48, 30};
  opt.q_offsets = {8, -10};
  Tensor want = ops::attention(round(q), round(k), round(v), opt);
  opt.compute_dtype = DType::BF16;
  EXPECT_TRUE(close_to_scale(ops::attention(q, k, v, opt), want, 1e-2));
  EXPECT_TRUE(close_to_scale(ops::attention(q, k.to(DType::BF16), v.to(DType::BF16), opt), want, 1e-2));
  EXPECT_TRUE(equal(ops::attention(q, k, v, opt), ops::attention(q, k.to(DType::BF16), v.to(DType::BF16), opt)));
  Tensor q_decode = q.narrow(1, 0, 3);
  ops::AttentionOptions f32_opt = opt;
  f32_opt.compute_dtype = DType::F32;
  EXPECT_TRUE(equal(ops::attention(q_decode, k, v, opt), ops::attention(q_decode, k, v, f32_opt)));
  opt.compute_dtype = DType::F16;
  expect_error([&] { ops::attention(q, k, v, opt); }, {"compute_dtype", "f16"});
}

TEST(Attention, MismatchErrorsNameShapes) {
  Tensor q = Tensor::zeros({1, 2, 3, 4}), k = Tensor::zeros({1, 2, 2, 4});
  expect_error([&] { ops::attention(q, k, k); }, {"3 query heads", "[1, 2, 3, 4]", "2 kv heads", "[1, 2, 2, 4]"});
  expect_error([&] { ops::attention(q, Tensor::zeros({1, 2, 1, 5}), Tensor::zeros({1, 2, 1, 5})); },
               {"[1, 2, 3, 4]", "[1, 2, 1, 5]"});
  ops::AttentionOptions bad;
  bad.kv_lens = {3};
  expect_error([&] { ops::attention(q, Tensor::zeros({1, 2, 1, 4}), Tensor::zeros({1, 2, 1, 4}), bad); },
               {"kv_lens[0] = 3", "[0, 2]"});
}

TEST(KVCache, PrefillThenDecodeEqualsFullAttention) {
  // Prefill of 20 takes the GEMM path, decode the row kernels: both must agree.
  const int64_t b = 2, t = 24, hq = 4, hkv = 2, d = 8, prefill = 20;
  Tensor q = Tensor::randn({b, t, hq, d}, 1), k = Tensor::randn({b, t, hkv, d}, 2), v = Tensor::randn({b, t, hkv, d}, 3);
  Tensor full = ops::attention(q, k, v);
  ops::KVCache cache(b, 32, hkv, d);
  std::vector<Tensor> pieces;
  pieces.push_back(ops::attention_with_cache(q.narrow(1, 0, prefill), cache, k.narrow(1, 0, prefill),
                                             v.narrow(1, 0, prefill)));
  for (int64_t i = prefill; i < t; ++i)
    pieces.push_back(ops::attention_with_cache(q.narrow(1, i, 1), cache, k.narrow(1, i, 1), v.narrow(1, i, 1)));
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{t, t}));
  EXPECT_TRUE(close(tp::cat(pieces, 1), full, 1e-5, 1e-5));
  // The cache holds exactly what was appended.
  EXPECT_TRUE(equal(cache.keys().narrow(1, 0, t), k));
  cache.reset();
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{0, 0}));
}

TEST(KVCache, Bf16CacheEqualsAttentionOverRoundedKeysAndValues) {
  // A bf16 cache stores k and v rounded to bf16; prefill (GEMM path, keys widened
  // once) and decode (row and head kernels reading bf16) must equal f32 attention
  // over the rounded k and v. Head dims 8 (masked tails) and 128 (full vectors).
  for (int64_t d : {8, 128}) {
    for (int64_t b : {1, 2}) {
      for (int threads : {1, 2}) {  // b = 1 on 2 threads: the per-head decode path
        omp_set_num_threads(threads);
        const int64_t t = 40, hq = 4, hkv = 2, prefill = 18;  // decode over 18 to 39 keys: blocks of 16 and a tail
        Tensor q = Tensor::randn({b, t, hq, d}, 1), k = Tensor::randn({b, t, hkv, d}, 2),
               v = Tensor::randn({b, t, hkv, d}, 3);
        Tensor kr = k.to(DType::BF16).to(DType::F32), vr = v.to(DType::BF16).to(DType::F32);
        Tensor want = ops::attention(q, kr, vr);
        ops::KVCache cache(b, 48, hkv, d, DType::BF16);
        EXPECT_EQ(cache.keys().dtype(), DType::BF16);
        std::vector<Tensor> pieces;
        pieces.push_back(ops::attention_with_cache(q.narrow(1, 0, prefill), cache, k.narrow(1, 0, prefill),
                                                   v.narrow(1, 0, prefill)));
        for (int64_t i = prefill; i < t; ++i)
          pieces.push_back(ops::attention_with_cache(q.narrow(1, i, 1), cache, k.narrow(1, i, 1), v.narrow(1, i, 1)));
        EXPECT_TRUE(close(tp::cat(pieces, 1), want, 1e-5, 1e-5)) << "d=" << d << " b=" << b << " threads=" << threads;
        EXPECT_TRUE(equal(cache.keys().narrow(1, 0, t).to(DType::F32), kr)) << "d=" << d;
      }
    }
  }
  omp_set_num_threads(1);
  // Gradients need f32 keys and values.
  Tensor q = Tensor::randn({1, 1, 2, 4}, 1).set_requires_grad(true), kb = Tensor::randn({1, 3, 1, 4}, 2).to(DType::BF16);
  expect_error([&] { ops::attention(q, kb, kb); }, {"gradients need f32 k and v", "bf16"});
  expect_error([&] { ops::attention(q, kb, Tensor::randn({1, 3, 1, 4}, 3)); }, {"must both be f32 or both bf16", "k bf16", "v f32"});
}

TEST(KVCache, PerSequenceLengthsAndOverflow) {
  // Right-padded prompts of lengths 2 and 4; then each decodes one token.
  const int64_t hkv = 1, d = 4;
  Tensor k = Tensor::randn({2, 4, hkv, d}, 1), v = Tensor::randn({2, 4, hkv, d}, 2);
  ops::KVCache cache(2, 6, hkv, d);
  cache.append(k, v, {2, 4});
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{2, 4}));
  Tensor q = Tensor::randn({2, 1, 2, d}, 3), kn = Tensor::randn({2, 1, hkv, d}, 4), vn = Tensor::randn({2, 1, hkv, d}, 5);
  Tensor out = ops::attention_with_cache(q, cache, kn, vn);
  // Reference for sequence 0: its two prompt keys plus the new one, nothing of the padding.
  for (int64_t s = 0; s < 2; ++s) {
    int64_t len = s == 0 ? 2 : 4;
    Tensor ks = tp::cat({k.narrow(0, s, 1).narrow(1, 0, len), kn.narrow(0, s, 1)}, 1);
    Tensor vs = tp::cat({v.narrow(0, s, 1).narrow(1, 0, len), vn.narrow(0, s, 1)}, 1);
    Tensor ref = ops::attention(q.narrow(0, s, 1), ks, vs);
    EXPECT_TRUE(close(out.narrow(0, s, 1), ref, 1e-6)) << "sequence " << s;
  }
  expect_error([&] { cache.append(Tensor::zeros({2, 2, hkv, d}), Tensor::zeros({2, 2, hkv, d})); },
               {"sequence 1", "7", "max_len 6"});
  expect_error([&] { cache.append(Tensor::zeros({2, 1, 3, d}), Tensor::zeros({2, 1, 3, d})); }, {"[2, 1, 3, 4]"});
}

TEST(KVCache, RowsAreViewsAndOneRowResets) {
  // A server's cache: one row per sequence slot. A prompt prefilled on rows(1, 1)
  // lands in row 1 of the shared memory; reset(1) empties that row alone.
  const int64_t hkv = 2, d = 4;
  ops::KVCache cache(3, 8, hkv, d);
  Tensor k0 = Tensor::randn({3, 2, hkv, d}, 1), v0 = Tensor::randn({3, 2, hkv, d}, 2);
  cache.append(k0, v0, {2, 0, 1});
  ops::KVCache row = cache.rows(1, 1);
  EXPECT_EQ(row.lengths(), (std::vector<int64_t>{0}));
  Tensor k = Tensor::randn({1, 3, hkv, d}, 3), v = Tensor::randn({1, 3, hkv, d}, 4);
  row.append(k, v);
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{2, 0, 1}));  // not yet taken back
  cache.take_lengths(row, 1);
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{2, 3, 1}));
  EXPECT_TRUE(equal(cache.keys().narrow(0, 1, 1).narrow(1, 0, 3), k));
  EXPECT_TRUE(equal(cache.values().narrow(0, 1, 1).narrow(1, 0, 3), v));
  EXPECT_TRUE(equal(cache.keys().narrow(0, 0, 1).narrow(1, 0, 2), k0.narrow(0, 0, 1)));  // neighbours untouched
  cache.reset(1);
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{2, 0, 1}));
  expect_error([&] { cache.reset(3); }, {"row 3", "[0, 3)"});
  expect_error([&] { cache.rows(2, 2); }, {"[2, 4)", "batch of 3"});
  expect_error([&] { cache.take_lengths(cache.rows(0, 1), 2); }, {"not rows(first = 2"});
}

TEST(KVCache, DecodeOfARowDoesNotDependOnTheOtherRows) {
  // Continuous batching decodes sequences of different lengths next to idle
  // rows (count 0): each row's output must be the bits it gets alone.
  const int64_t hq = 4, hkv = 2, d = 8, max_len = 16;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    ops::KVCache batch(3, max_len, hkv, d), alone(1, max_len, hkv, d);
    Tensor k = Tensor::randn({3, 9, hkv, d}, 1), v = Tensor::randn({3, 9, hkv, d}, 2);
    batch.append(k, v, {9, 0, 5});
    alone.append(k.narrow(0, 2, 1).narrow(1, 0, 5), v.narrow(0, 2, 1).narrow(1, 0, 5));
    Tensor q = Tensor::randn({3, 1, hq, d}, 3), kn = Tensor::randn({3, 1, hkv, d}, 4), vn = Tensor::randn({3, 1, hkv, d}, 5);
    std::vector<int64_t> q_offsets = batch.lengths();
    batch.append(kn, vn, {1, 0, 1});
    Tensor out = ops::attention(q, batch.keys(), batch.values(), {.kv_lens = batch.lengths(), .q_offsets = q_offsets});
    Tensor solo = ops::attention_with_cache(q.narrow(0, 2, 1), alone, kn.narrow(0, 2, 1), vn.narrow(0, 2, 1));
    EXPECT_TRUE(equal(out.narrow(0, 2, 1), solo)) << "threads " << threads;
    EXPECT_TRUE(equal(out.narrow(0, 1, 1), Tensor::zeros({1, 1, hq, d})));  // idle: no key to read
  }
  omp_set_num_threads(1);
}

TEST(KVCache, DecodeAllocatesNoCacheMemory) {
  ops::KVCache cache(1, 8, 1, 4);
  void* keys = cache.keys().raw_data();
  for (int i = 0; i < 8; ++i)
    ops::attention_with_cache(Tensor::randn({1, 1, 1, 4}, i), cache, Tensor::randn({1, 1, 1, 4}, 10 + i),
                              Tensor::randn({1, 1, 1, 4}, 20 + i));
  EXPECT_EQ(cache.keys().raw_data(), keys);
  EXPECT_EQ(cache.lengths()[0], 8);
}

TEST(KVCache, ForLayersShareOneBlockYetStayApart) {
  // Mixed kv heads and dtypes, each layer filled to max_len with its own values:
  // no layer's keys or values may spill into another's.
  const int64_t b = 2, max_len = 5, d = 4;
  std::vector<ops::KVCache::Layer> layout{{2, DType::F32}, {1, DType::BF16}, {3, DType::F32}};
  std::vector<ops::KVCache> caches = ops::KVCache::for_layers(b, max_len, d, layout);
  ASSERT_EQ(caches.size(), layout.size());
  std::vector<Tensor> ks, vs;
  for (size_t l = 0; l < layout.size(); ++l) {
    EXPECT_EQ(caches[l].keys().shape(), (Shape{b, max_len, layout[l].kv_heads, d}));
    EXPECT_EQ(caches[l].values().dtype(), layout[l].dtype);
    EXPECT_TRUE(caches[l].keys().same_storage(caches[0].keys()));
    EXPECT_EQ(max_abs(caches[l].keys()) + max_abs(caches[l].values()), 0.0);  // starts zeroed
    EXPECT_EQ(reinterpret_cast<uintptr_t>(caches[l].values().raw_data()) % 64, 0u);
    ks.push_back(Tensor::randn({b, max_len, layout[l].kv_heads, d}, 10 + l).to(layout[l].dtype).to(DType::F32));
    vs.push_back(Tensor::randn({b, max_len, layout[l].kv_heads, d}, 20 + l).to(layout[l].dtype).to(DType::F32));
    caches[l].append(ks[l], vs[l]);
  }
  for (size_t l = 0; l < layout.size(); ++l) {
    EXPECT_TRUE(equal(caches[l].keys().to(DType::F32), ks[l])) << "layer " << l;
    EXPECT_TRUE(equal(caches[l].values().to(DType::F32), vs[l])) << "layer " << l;
    EXPECT_EQ(caches[l].lengths(), (std::vector<int64_t>{max_len, max_len}));
  }
  // A block of 2 MiB or more starts on a huge-page boundary (the point of one
  // block), and the next generation's caches reuse it: no fresh pages to fault in.
  const std::vector<ops::KVCache::Layer> two_layers{{8, DType::BF16}, {8, DType::BF16}};
  {
    std::vector<ops::KVCache> big = ops::KVCache::for_layers(1, 1024, 128, two_layers);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(big[0].keys().raw_data()) % (uintptr_t{2} << 20), 0u);
  }
  size_t system_allocations = allocator_stats().system_allocations;
  std::vector<ops::KVCache> again = ops::KVCache::for_layers(1, 1024, 128, two_layers);
  EXPECT_EQ(allocator_stats().system_allocations, system_allocations);
  expect_error([&] { ops::KVCache::for_layers(1, 4, 8, {{2, DType::F32}, {0, DType::F32}}); },
               {"kv_heads 0", "head_dim 8"});
  expect_error([&] { ops::KVCache::for_layers(1, 4, 8, {{2, DType::I64}}); }, {"f32 or bf16", "i64"});
}

TEST(VecKernels, BothIsaPathsMatchNaive) {
  for (const auto& k : {ops::detail::vec_kernels(), ops::detail::vec_kernels_avx2()}) {
    for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 33, 128, 130}) {
      std::vector<float> a = Tensor::randn({n}, 1).to_vector(), b = Tensor::randn({n}, 2).to_vector();
      std::vector<float> y = b, want = b;
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) {
        dot += static_cast<double>(a[i]) * b[i];
        want[i] += 0.5f * a[i];
      }
      EXPECT_NEAR(k.dot(a.data(), b.data(), n), dot, 1e-4) << k.isa << " n=" << n;
      k.axpy(0.5f, a.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], want[i], 1e-6) << k.isa << " n=" << n << " i=" << i;
    }
  }
}

TEST(VecKernels, SwigluMatchesNaive) {
  for (const auto& k : {ops::detail::vec_kernels(), ops::detail::vec_kernels_avx2()}) {
    for (int64_t n : {0, 1, 15, 16, 17, 100}) {
      // Gate values spread wide, plus the ends of exp's range and beyond.
      std::vector<float> a = Tensor::randn({n}, 8, 0, 10.f).to_vector(), b = Tensor::randn({n}, 9).to_vector();
      const float ends[] = {0.f, -87.f, 88.f, -100.f, 100.f, -1e30f};
      for (int64_t i = 0; i < std::min<int64_t>(n, 6); ++i) a[i * n / 6] = ends[i];
      std::vector<float> out(static_cast<size_t>(n) + 1, -7.f);
      k.swiglu(a.data(), b.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        double want = a[i] / (1.0 + std::exp(-static_cast<double>(a[i]))) * b[i];
        EXPECT_NEAR(out[i], want, 1e-6 * std::abs(want) + 1e-30) << k.isa << " n=" << n << " a=" << a[i];
      }
      EXPECT_EQ(out[n], -7.f) << k.isa << ": swiglu wrote past n";
    }
  }
}

TEST(VecKernels, SoftmaxDotsAxpysMatchNaive) {
  for (const auto& k : {ops::detail::vec_kernels(), ops::detail::vec_kernels_avx2()}) {
    for (int64_t n : {1, 7, 16, 17, 33, 130}) {
      // softmax, with scores spread wide enough to exercise exp's range
      std::vector<float> x = Tensor::randn({n}, 3, 0, 20.f).to_vector(), y = x;
      k.softmax(y.data(), n, 0.7f);
      double mx = -1e30, total = 0;
      for (float v : x) mx = std::max(mx, 0.7 * v);
      for (float v : x) total += std::exp(0.7 * v - mx);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(y[i], std::exp(0.7 * x[i] - mx) / total, 1e-6) << k.isa << " softmax n=" << n << " i=" << i;
      // dots and axpys: 3 rows against n keys 2*d apart
      for (int64_t d : {5, 16, 64, 80, 128}) {
        const int64_t rows = 3, stride = 2 * d;
        std::vector<float> q = Tensor::randn({rows * d}, 4).to_vector(), kv = Tensor::randn({n * stride}, 5).to_vector();
        std::vector<float> p = Tensor::randn({rows * (n + 1)}, 6).to_vector(), o = Tensor::randn({rows * d}, 7).to_vector();
        std::vector<float> dots(static_cast<size_t>(rows * (n + 1)), -1.f), want_o = o;
        k.dots(q.data(), rows, kv.data(), stride, n, d, dots.data(), n + 1);
        k.axpys(p.data(), n + 1, rows, kv.data(), stride, n, d, o.data());
        // The bf16 forms over the same rows rounded to bf16 give the f32 forms' results on the rounded rows.
        std::vector<bf16> kv16(kv.size());
        convert_f32_to_bf16(kv.data(), kv16.data(), kv.size());
        std::vector<float> kvr(kv.size()), dots_r(dots.size(), -1.f), dots16(dots.size(), -1.f), o_r = want_o,
            o16 = want_o;
        convert_bf16_to_f32(kv16.data(), kvr.data(), kv.size());
        k.dots(q.data(), rows, kvr.data(), stride, n, d, dots_r.data(), n + 1);
        k.dots_bf16(q.data(), rows, kv16.data(), stride, n, d, dots16.data(), n + 1);
        k.axpys(p.data(), n + 1, rows, kvr.data(), stride, n, d, o_r.data());
        k.axpys_bf16(p.data(), n + 1, rows, kv16.data(), stride, n, d, o16.data());
        for (size_t i = 0; i < dots.size(); ++i) EXPECT_NEAR(dots16[i], dots_r[i], 1e-5) << k.isa << " dots_bf16 d=" << d;
        for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o16[i], o_r[i], 1e-5) << k.isa << " axpys_bf16 d=" << d;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < n; ++j) {
            double want = 0;
            for (int64_t c = 0; c < d; ++c) want += static_cast<double>(q[r * d + c]) * kv[j * stride + c];
            EXPECT_NEAR(dots[r * (n + 1) + j], want, 1e-4) << k.isa << " dots n=" << n << " d=" << d;
          }
          EXPECT_EQ(dots[r * (n + 1) + n], -1.f) << k.isa << ": dots wrote past its n keys";
          for (int64_t c = 0; c < d; ++c) {
            double want = want_o[r * d + c];
            for (int64_t j = 0; j < n; ++j) want += static_cast<double>(p[r * (n + 1) + j]) * kv[j * stride + c];
            EXPECT_NEAR(o[r * d + c], want, 1e-4) << k.isa << " axpys n=" << n << " d=" << d;
          }
        }
      }
    }
  }
}
