// Sliding-window attention and attention sinks against an explicit reference: the
// full score matrix, a mask written from its definition (key j visible to the
// query at position p iff j <= p and j > p - W), the sink as one more column of
// the softmax whose value is zero, all in double. Forward on every kernel path
// (GEMM prefill, decode rows, decode heads), backward, gradcheck, the KV cache.
#include <omp.h>

#include <cmath>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/ops/attention.h"

using namespace tp;
using namespace tp::test;

namespace {

struct Reference {
  std::vector<double> out, dq, dk, dv, dsinks;
};

// q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D]; query i at position Tk - Tq + i (or opt.q_offsets).
Reference explicit_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionOptions& opt,
                             const Tensor& dout = Tensor()) {
  const int64_t b = q.size(0), tq = q.size(1), hq = q.size(2), d = q.size(3), tk = k.size(1), hkv = k.size(2);
  const std::vector<float> qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
  const std::vector<float> gv = dout.defined() ? dout.to_vector() : std::vector<float>(qv.size(), 0.f);
  const std::vector<float> sinks = opt.sinks.defined() ? opt.sinks.to_vector() : std::vector<float>();
  const double scale = opt.scale != 0 ? opt.scale : 1 / std::sqrt(static_cast<double>(d));
  Reference r{std::vector<double>(qv.size()), std::vector<double>(qv.size()), std::vector<double>(kv.size()),
              std::vector<double>(vv.size()), std::vector<double>(static_cast<size_t>(hq))};
  auto qi = [&](int64_t s, int64_t i, int64_t h) { return ((s * tq + i) * hq + h) * d; };
  auto ki = [&](int64_t s, int64_t j, int64_t h) { return ((s * tk + j) * hkv + h) * d; };
  for (int64_t s = 0; s < b; ++s) {
    const int64_t off = opt.q_offsets.empty() ? tk - tq : opt.q_offsets[s];
    const int64_t len = opt.kv_lens.empty() ? tk : opt.kv_lens[s];
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / (hq / hkv);
      for (int64_t i = 0; i < tq; ++i) {
        const int64_t pos = off + i;
        // One row of the mask and scores; the sink is column tk.
        std::vector<double> logit(static_cast<size_t>(tk) + 1, -INFINITY);
        for (int64_t j = 0; j < len; ++j) {
          const bool visible = (!opt.causal || j <= pos) && (opt.sliding_window == 0 || j > pos - opt.sliding_window);
          if (!visible) continue;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qv[qi(s, i, h) + c]) * kv[ki(s, j, kh) + c];
          logit[j] = dot * scale;
        }
        bool any = false;
        for (int64_t j = 0; j < tk; ++j) any = any || logit[j] > -INFINITY;
        if (!any) continue;  // no visible key: zeros
        if (!sinks.empty()) logit[tk] = sinks[h];
        double top = -INFINITY, z = 0;
        for (double x : logit) top = std::max(top, x);
        std::vector<double> p(logit.size());
        for (size_t j = 0; j < p.size(); ++j) z += (p[j] = std::exp(logit[j] - top));
        for (double& x : p) x /= z;
        // out = sum_j p_j v_j (the sink's value is zero); then the backward of that row.
        std::vector<double> dp(static_cast<size_t>(tk));
        double pdp = 0;
        for (int64_t j = 0; j < tk; ++j) {
          for (int64_t c = 0; c < d; ++c) {
            r.out[qi(s, i, h) + c] += p[j] * vv[ki(s, j, kh) + c];
            dp[j] += static_cast<double>(gv[qi(s, i, h) + c]) * vv[ki(s, j, kh) + c];
          }
          pdp += p[j] * dp[j];
        }
        for (int64_t j = 0; j < tk; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          for (int64_t c = 0; c < d; ++c) {
            r.dq[qi(s, i, h) + c] += ds * kv[ki(s, j, kh) + c];
            r.dk[ki(s, j, kh) + c] += ds * qv[qi(s, i, h) + c];
            r.dv[ki(s, j, kh) + c] += p[j] * gv[qi(s, i, h) + c];
          }
        }
        r.dsinks[h] -= p[tk] * pdp;
      }
    }
  }
  return r;
}

::testing::AssertionResult close_to_scale(const Tensor& got, const std::vector<double>& want, double tol) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  return close(got, want, tol * scale);
}

struct Case {
  const char* name;
  int64_t b, tq, tk, hq, hkv, d, window;
  bool sinks;
  std::vector<int64_t> q_offsets, kv_lens;
};

// Decode-sized (Tq < 16: the row and head kernels) and prefill-sized (the GEMM
// path, blocks of 64 rows; in the backward 128 / group stacked rows) shapes, the
// window shorter than a block and longer than the sequence, offsets (a cache
// continuation) and padding.
std::vector<Case> cases() {
  return {
      {"window, decode", 2, 3, 30, 4, 2, 8, 5, false, {27, 10}, {30, 13}},
      {"window, prefill two blocks", 1, 150, 150, 2, 1, 16, 37, false, {}, {}},
      {"window, prefill continuation", 2, 70, 90, 4, 2, 8, 20, false, {20, 5}, {90, 75}},
      {"window longer than the sequence", 1, 40, 40, 2, 2, 8, 100, false, {}, {}},
      {"window of one key", 1, 20, 20, 2, 1, 8, 1, false, {}, {}},
      {"sinks, decode", 2, 2, 12, 4, 1, 8, 0, true, {10, 3}, {12, 5}},
      {"sinks, prefill", 2, 70, 70, 4, 2, 8, 0, true, {}, {}},
      {"sinks and window, prefill", 1, 140, 140, 2, 1, 8, 16, true, {}, {}},
      {"sinks and window, decode", 1, 1, 40, 8, 2, 8, 6, true, {39}, {40}},
      {"window over several key blocks, decode", 1, 1, 60, 4, 2, 8, 40, false, {59}, {60}},
  };
}

ops::AttentionOptions options_of(const Case& c, const Tensor& sinks) {
  ops::AttentionOptions opt;
  opt.sliding_window = c.window;
  opt.q_offsets = c.q_offsets;
  opt.kv_lens = c.kv_lens;
  if (c.sinks) opt.sinks = sinks;
  return opt;
}

}  // namespace

TEST(AttentionMasks, ForwardMatchesExplicitMaskOnEveryKernelPath) {
  for (int threads : {1, 2}) {  // decode: rows per thread, or kv heads per thread
    omp_set_num_threads(threads);
    for (const Case& c : cases()) {
      Tensor q = Tensor::randn({c.b, c.tq, c.hq, c.d}, 1), k = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 2),
             v = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 3), sinks = Tensor::randn({c.hq}, 5, 0.f, 2.f);
      const ops::AttentionOptions opt = options_of(c, sinks);
      EXPECT_TRUE(close(ops::attention(q, k, v, opt), explicit_attention(q, k, v, opt).out, 1e-5, 1e-4))
          << c.name << ", " << threads << " threads";
    }
  }
  omp_set_num_threads(2);
}

TEST(AttentionMasks, TheWindowChangesTheOutputOnlyPastIt) {
  // Queries within the first W positions see what full causal attention sees.
  Tensor q = Tensor::randn({1, 30, 2, 8}, 1), k = Tensor::randn({1, 30, 2, 8}, 2), v = Tensor::randn({1, 30, 2, 8}, 3);
  Tensor full = ops::attention(q, k, v), windowed = ops::attention(q, k, v, {.sliding_window = 10});
  EXPECT_TRUE(equal(full.narrow(1, 0, 10), windowed.narrow(1, 0, 10)));
  EXPECT_FALSE(close(full.narrow(1, 10, 20), windowed.narrow(1, 10, 20), 1e-3));
}

TEST(AttentionMasks, BackwardMatchesExplicitReference) {
  for (const Case& c : cases()) {
    Tensor q = Tensor::randn({c.b, c.tq, c.hq, c.d}, 1), k = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 2),
           v = Tensor::randn({c.b, c.tk, c.hkv, c.d}, 3), sinks = Tensor::randn({c.hq}, 5, 0.f, 2.f),
           dout = Tensor::randn({c.b, c.tq, c.hq, c.d}, 4);
    const ops::AttentionOptions opt = options_of(c, sinks);
    Reference want = explicit_attention(q, k, v, opt, dout);
    ops::AttentionGrads got = ops::attention_backward(q, k, v, dout, opt);
    EXPECT_TRUE(close_to_scale(got.dq, want.dq, 1e-5)) << c.name << ": dq";
    EXPECT_TRUE(close_to_scale(got.dk, want.dk, 1e-5)) << c.name << ": dk";
    EXPECT_TRUE(close_to_scale(got.dv, want.dv, 1e-5)) << c.name << ": dv";
    if (c.sinks) {
      EXPECT_TRUE(close_to_scale(got.dsinks, want.dsinks, 1e-5)) << c.name << ": dsinks";
    } else {
      EXPECT_FALSE(got.dsinks.defined()) << c.name;
    }
  }
}

TEST(AttentionMasks, GradcheckWithWindowAndSinks) {
  ops::AttentionOptions opt;
  opt.sliding_window = 2;
  opt.q_offsets = {1, 0};
  opt.kv_lens = {4, 3};
  auto fn = [opt](const std::vector<Tensor>& in) {
    ops::AttentionOptions o = opt;
    o.sinks = in[3];
    return ops::attention(in[0], in[1], in[2], o);
  };
  TP_EXPECT_GRADCHECK(fn, {param({2, 3, 4, 3}, 1), param({2, 4, 2, 3}, 2), param({2, 4, 2, 3}, 3), param({4}, 4)});
  auto window_only = [](const std::vector<Tensor>& in) {
    return ops::attention(in[0], in[1], in[2], {.sliding_window = 3});
  };
  TP_EXPECT_GRADCHECK(window_only, {param({1, 6, 2, 3}, 1), param({1, 6, 1, 3}, 2), param({1, 6, 1, 3}, 3)});
}

TEST(AttentionMasks, RecordedBackwardGivesTheSinksTheirGradient) {
  Tensor q = param({1, 5, 2, 4}, 1), k = param({1, 5, 1, 4}, 2), v = param({1, 5, 1, 4}, 3), sinks = param({2}, 4);
  Tensor dout = Tensor::randn({1, 5, 2, 4}, 5);
  ops::AttentionOptions opt{.sliding_window = 3, .sinks = sinks};
  autograd::backward(ops::attention(q, k, v, opt), dout);
  ops::AttentionGrads want = ops::attention_backward(q, k, v, dout, opt);
  EXPECT_TRUE(equal(sinks.grad(), want.dsinks));
  EXPECT_TRUE(equal(q.grad(), want.dq) && equal(k.grad(), want.dk) && equal(v.grad(), want.dv));
}

TEST(AttentionMasks, KvCachePrefillThenDecodeEqualsOnePass) {
  // 40 tokens through the cache (a prompt of 20 on the GEMM path, then one token
  // at a time) equal attention over the whole sequence, with the window and sinks.
  const int64_t T = 40, P = 20, hq = 4, hkv = 2, d = 8;
  Tensor q = Tensor::randn({2, T, hq, d}, 1), k = Tensor::randn({2, T, hkv, d}, 2), v = Tensor::randn({2, T, hkv, d}, 3);
  Tensor sinks = Tensor::randn({hq}, 4);
  for (bool with_sinks : {false, true}) {
    ops::AttentionOptions opt{.sliding_window = 7};
    if (with_sinks) opt.sinks = sinks;
    Tensor want = ops::attention(q, k, v, opt);
    ops::KVCache cache(2, T, hkv, d);
    std::vector<Tensor> parts{ops::attention_with_cache(q.narrow(1, 0, P), cache, k.narrow(1, 0, P),
                                                        v.narrow(1, 0, P), opt)};
    for (int64_t t = P; t < T; ++t)
      parts.push_back(ops::attention_with_cache(q.narrow(1, t, 1), cache, k.narrow(1, t, 1), v.narrow(1, t, 1), opt));
    for (int64_t t = 0; t < T - P + 1; ++t) {
      const int64_t at = t == 0 ? 0 : P + t - 1, len = t == 0 ? P : 1;
      EXPECT_TRUE(close(parts[t], want.narrow(1, at, len), 1e-5, 1e-5))
          << (with_sinks ? "sinks, " : "") << "step " << t;
    }
  }
}

TEST(AttentionMasks, ErrorsNameTheOption) {
  Tensor q = Tensor::randn({1, 2, 4, 8}, 1), k = Tensor::randn({1, 2, 2, 8}, 2);
  expect_error([&] { ops::attention(q, k, k, {.sliding_window = -1}); }, {"sliding_window must be >= 0", "-1"});
  expect_error([&] { ops::attention(q, k, k, {.causal = false, .sliding_window = 4}); },
               {"sliding_window 4 needs causal attention"});
  expect_error([&] { ops::attention(q, k, k, {.sinks = Tensor::zeros({2})}); },
               {"sinks [2] must be [Hq]", "[1, 2, 4, 8]", "has 4"});
}
