#include "tp/ops/moe_experts.h"

#include <cmath>
#include <cstring>

#include "tp/autograd/tape.h"
#include "tp/ops/gemm.h"

namespace tp::ops {

namespace {

// The (token, slot) pairs of each expert: pairs[offsets[e] .. offsets[e+1]) are
// expert e's, in token order (a counting sort: no comparison sort per call).
struct Groups {
  std::vector<int64_t> offsets;  // E + 1
  std::vector<int64_t> pairs;    // flat index n * K + k
};

Groups group_by_expert(const Tensor& ids, int64_t experts) {
  const int64_t* id = ids.data<int64_t>();
  const int64_t n = ids.numel();
  Groups g;
  g.offsets.assign(static_cast<size_t>(experts + 2), 0);
  for (int64_t p = 0; p < n; ++p) {
    TP_CHECK(id[p] >= 0 && id[p] <= experts,
             "moe_experts: expert id {} (token {}, slot {}) is outside [0, {}] ({} experts, {} = skipped)", id[p],
             p / ids.size(1), p % ids.size(1), experts, experts, experts);
    ++g.offsets[static_cast<size_t>(id[p]) + 1];
  }
  for (int64_t e = 0; e <= experts; ++e) g.offsets[e + 1] += g.offsets[e];
  std::vector<int64_t> at(g.offsets.begin(), g.offsets.end() - 1);
  g.pairs.resize(static_cast<size_t>(g.offsets[experts]));  // the sentinel's pairs are dropped
  for (int64_t p = 0; p < n; ++p)
    if (id[p] < experts) g.pairs[static_cast<size_t>(at[id[p]]++)] = p;
  g.offsets.pop_back();
  return g;
}

// C [m, n] = A [m, k] · B^T (B stored [n, k]) or A · B (B stored [k, n]).
void gemm_rows(const float* a, const Tensor& b_all, int64_t b_offset_elems, int64_t m, int64_t n, int64_t k,
               bool trans_b, float* c, bool accumulate = false) {
  detail::GemmSpec s{.m = m, .n = n, .k = k, .trans_b = trans_b, .a_dtype = DType::F32, .b_dtype = b_all.dtype()};
  s.accumulate = accumulate;
  const char* b = static_cast<const char*>(b_all.raw_data()) + b_offset_elems * dtype_size(b_all.dtype());
  detail::gemm(s, a, b, nullptr, c);
}

float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

// One expert's activations for its c pairs, recomputed by the backward.
struct ExpertPass {
  std::vector<float> x;   // [c, H] the tokens
  std::vector<float> gu;  // [c, 2I] gate | up
  std::vector<float> a;   // [c, I] silu(gate) * up
  std::vector<float> y;   // [c, H] the expert's output (unweighted)
};

void run_expert(ExpertPass& p, const float* x, const int64_t* pairs, int64_t c, int64_t K, int64_t H, int64_t I,
                const Tensor& gate_up, const Tensor& down, int64_t e) {
  p.x.resize(static_cast<size_t>(c * H));
  for (int64_t i = 0; i < c; ++i) std::memcpy(&p.x[i * H], x + (pairs[i] / K) * H, H * sizeof(float));
  p.gu.resize(static_cast<size_t>(c * 2 * I));
  gemm_rows(p.x.data(), gate_up, e * 2 * I * H, c, 2 * I, H, true, p.gu.data());
  p.a.resize(static_cast<size_t>(c * I));
#pragma omp parallel for if (c * I > 32768)
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < I; ++j) {
      const float g = p.gu[i * 2 * I + j];
      p.a[i * I + j] = g * sigmoid(g) * p.gu[i * 2 * I + I + j];
    }
  p.y.resize(static_cast<size_t>(c * H));
  gemm_rows(p.a.data(), down, e * H * I, c, H, I, true, p.y.data());
}

struct Dims {
  int64_t N, H, K, E, I;
};

Dims check_shapes(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                  const Tensor& down) {
  TP_CHECK(x.dim() == 2 && x.dtype() == DType::F32, "moe_experts: x must be f32 [tokens, hidden], got {} {}",
           dtype_name(x.dtype()), shape_str(x.shape()));
  TP_CHECK(ids.dim() == 2 && ids.dtype() == DType::I64 && ids.size(0) == x.size(0),
           "moe_experts: ids must be i64 [{}, top_k], got {} {}", x.size(0), dtype_name(ids.dtype()),
           shape_str(ids.shape()));
  TP_CHECK(weights.dtype() == DType::F32 && weights.shape() == ids.shape(),
           "moe_experts: weights must be f32 {} like the ids, got {} {}", shape_str(ids.shape()),
           dtype_name(weights.dtype()), shape_str(weights.shape()));
  TP_CHECK(gate_up.dim() == 3 && gate_up.size(2) == x.size(1) && gate_up.size(1) % 2 == 0,
           "moe_experts: gate_up_proj must be [experts, 2 x intermediate, {}], got {}", x.size(1),
           shape_str(gate_up.shape()));
  const int64_t E = gate_up.size(0), I = gate_up.size(1) / 2;
  TP_CHECK(down.shape() == (Shape{E, x.size(1), I}), "moe_experts: down_proj must be {} to match gate_up_proj {}, got {}",
           shape_str(Shape{E, x.size(1), I}), shape_str(gate_up.shape()), shape_str(down.shape()));
  return {x.size(0), x.size(1), ids.size(1), E, I};
}

}  // namespace

Tensor moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                   const Tensor& down) {
  const Dims d = check_shapes(x, ids, weights, gate_up, down);
  const Groups groups = group_by_expert(ids, d.E);
  Tensor out = Tensor::zeros({d.N, d.H});
  float* o = out.data<float>();
  const float* w = weights.data<float>();
  ExpertPass pass;
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t c = groups.offsets[e + 1] - groups.offsets[e];
    if (c == 0) continue;
    const int64_t* pairs = &groups.pairs[static_cast<size_t>(groups.offsets[e])];
    run_expert(pass, x.data<float>(), pairs, c, d.K, d.H, d.I, gate_up, down, e);
    for (int64_t i = 0; i < c; ++i) {
      float* row = o + (pairs[i] / d.K) * d.H;
      const float wi = w[pairs[i]];
      const float* y = &pass.y[i * d.H];
      for (int64_t j = 0; j < d.H; ++j) row[j] += wi * y[j];
    }
  }
  if (!autograd::needs_grad({x, weights, gate_up, down})) return out;

  autograd::record(
      "moe_experts", {x, weights, gate_up, down}, {out},
      [x, ids, weights, gate_up, down, d](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        // The weights' gradients are computed in f32 (a trainer's masters are f32).
        const Tensor gu32 = gate_up.to(DType::F32), dn32 = down.to(DType::F32);
        const Groups groups = group_by_expert(ids, d.E);
        const float* dout = grads[0].data<float>();
        const float* w = weights.data<float>();
        Tensor dx = Tensor::zeros({d.N, d.H}), dw = Tensor::zeros({d.N, d.K});
        Tensor dgu = Tensor::zeros(gate_up.shape()), ddown = Tensor::zeros(down.shape());
        ExpertPass pass;
        std::vector<float> dy, da, dg, dxe;
        for (int64_t e = 0; e < d.E; ++e) {
          const int64_t c = groups.offsets[e + 1] - groups.offsets[e];
          if (c == 0) continue;
          const int64_t* pairs = &groups.pairs[static_cast<size_t>(groups.offsets[e])];
          run_expert(pass, x.data<float>(), pairs, c, d.K, d.H, d.I, gu32, dn32, e);
          // dweight = <dout[token], y>; dy = weight * dout[token]
          dy.resize(static_cast<size_t>(c * d.H));
          for (int64_t i = 0; i < c; ++i) {
            const float* g = dout + (pairs[i] / d.K) * d.H;
            const float wi = w[pairs[i]];
            double dot = 0;
            for (int64_t j = 0; j < d.H; ++j) {
              dot += static_cast<double>(g[j]) * pass.y[i * d.H + j];
              dy[i * d.H + j] = wi * g[j];
            }
            dw.data<float>()[pairs[i]] = static_cast<float>(dot);
          }
          // y = a down^T: da = dy down; ddown += dy^T a
          da.resize(static_cast<size_t>(c * d.I));
          gemm_rows(dy.data(), dn32, e * d.H * d.I, c, d.I, d.H, false, da.data());
          detail::gemm({.m = d.H, .n = d.I, .k = c, .trans_a = true, .accumulate = true}, dy.data(), pass.a.data(),
                       nullptr, ddown.data<float>() + e * d.H * d.I);
          // a = silu(g) u: dg = da u silu'(g), du = da silu(g)
          dg.resize(static_cast<size_t>(c * 2 * d.I));
          for (int64_t i = 0; i < c; ++i)
            for (int64_t j = 0; j < d.I; ++j) {
              const float g = pass.gu[i * 2 * d.I + j], u = pass.gu[i * 2 * d.I + d.I + j];
              const float s = sigmoid(g), grad = da[i * d.I + j];
              dg[i * 2 * d.I + j] = grad * u * (s + g * s * (1.f - s));
              dg[i * 2 * d.I + d.I + j] = grad * g * s;
            }
          // gu = x gate_up^T: dx = dg gate_up; dgate_up += dg^T x
          dxe.resize(static_cast<size_t>(c * d.H));
          gemm_rows(dg.data(), gu32, e * 2 * d.I * d.H, c, d.H, 2 * d.I, false, dxe.data());
          detail::gemm({.m = 2 * d.I, .n = d.H, .k = c, .trans_a = true, .accumulate = true}, dg.data(),
                       pass.x.data(), nullptr, dgu.data<float>() + e * 2 * d.I * d.H);
          for (int64_t i = 0; i < c; ++i) {
            float* row = dx.data<float>() + (pairs[i] / d.K) * d.H;
            for (int64_t j = 0; j < d.H; ++j) row[j] += dxe[i * d.H + j];
          }
        }
        return {dx, dw, gate_up.dtype() == DType::F32 ? dgu : dgu.to(gate_up.dtype()),
                down.dtype() == DType::F32 ? ddown : ddown.to(down.dtype())};
      });
  return out;
}

}  // namespace tp::ops

namespace tp::ops {

void softmax_row(const float* logits, int64_t E, float* probs) {
  float mx = logits[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  double z = 0;
  for (int64_t e = 0; e < E; ++e) z += probs[e] = std::exp(logits[e] - mx);
  for (int64_t e = 0; e < E; ++e) probs[e] = static_cast<float>(probs[e] / z);
}

void top_k_row(const float* probs, int64_t E, int64_t k, int64_t* ids) {
  // k passes of a max over E (k is small: 2 for Mixtral, 8 for Qwen3-30B-A3B).
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (best >= 0 && !(probs[e] > probs[best])) continue;
      bool taken = false;
      for (int64_t i = 0; i < j && !taken; ++i) taken = ids[i] == e;
      if (!taken) best = e;
    }
    ids[j] = best;
  }
}

TopK softmax_top_k(const Tensor& logits, int64_t k, bool renormalize) {
  TP_CHECK(logits.dim() == 2 && logits.dtype() == DType::F32, "softmax_top_k: logits must be f32 [tokens, experts], "
           "got {} {}", dtype_name(logits.dtype()), shape_str(logits.shape()));
  const int64_t N = logits.size(0), E = logits.size(1);
  TP_CHECK(k >= 1 && k <= E, "softmax_top_k: top_k {} must be in [1, {}] (the number of experts)", k, E);
  Tensor probs = Tensor::empty({N, E}), weights = Tensor::empty({N, k}), ids = Tensor::empty({N, k}, DType::I64);
  std::vector<float> sums(static_cast<size_t>(N));
  const float* l = logits.data<float>();
  float* p = probs.data<float>();
  float* w = weights.data<float>();
  int64_t* id = ids.data<int64_t>();
#pragma omp parallel for if (N * E > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const float* pr = p + n * E;
    softmax_row(l + n * E, E, p + n * E);
    top_k_row(pr, E, k, id + n * k);
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += w[n * k + j] = pr[id[n * k + j]];
    sums[n] = static_cast<float>(s);
    if (renormalize)
      for (int64_t j = 0; j < k; ++j) w[n * k + j] /= sums[n];
  }
  if (autograd::needs_grad({logits}))
    autograd::record("softmax_top_k", {logits}, {weights},
                     [probs, weights, ids, sums, renormalize, N, E, k](const std::vector<Tensor>& g) {
                       const float* dw = g[0].data<float>();
                       const float* w = weights.data<float>();
                       const float* p = probs.data<float>();
                       const int64_t* id = ids.data<int64_t>();
                       Tensor dl = Tensor::zeros({N, E});
                       float* d = dl.data<float>();
                       for (int64_t n = 0; n < N; ++n) {
                         // d p_selected: w = p / S  =>  dp_j = (dw_j - sum_i dw_i w_i) / S
                         double dot = 0;
                         if (renormalize)
                           for (int64_t j = 0; j < k; ++j) dot += dw[n * k + j] * w[n * k + j];
                         std::vector<float> dp(static_cast<size_t>(E), 0.f);
                         for (int64_t j = 0; j < k; ++j)
                           dp[id[n * k + j]] = renormalize ? static_cast<float>((dw[n * k + j] - dot) / sums[n])
                                                           : dw[n * k + j];
                         // softmax: dl_e = p_e (dp_e - sum_i dp_i p_i)
                         double inner = 0;
                         for (int64_t e = 0; e < E; ++e) inner += dp[e] * p[n * E + e];
                         for (int64_t e = 0; e < E; ++e)
                           d[n * E + e] = static_cast<float>(p[n * E + e] * (dp[e] - inner));
                       }
                       return std::vector<Tensor>{dl};
                     });
  return {weights, ids};
}

}  // namespace tp::ops

namespace tp::ops {

Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows) {
  TP_CHECK(x.dim() == 2 && x.dtype() == DType::F32, "gather_rows: x must be f32 [rows, width], got {} {}",
           dtype_name(x.dtype()), shape_str(x.shape()));
  const int64_t N = x.size(0), H = x.size(1), P = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty({P, H});
  for (int64_t p = 0; p < P; ++p) {
    TP_CHECK(rows[p] >= 0 && rows[p] < N, "gather_rows: row {} outside [0, {})", rows[p], N);
    std::memcpy(out.data<float>() + p * H, x.data<float>() + rows[p] * H, H * sizeof(float));
  }
  if (autograd::needs_grad({x}))
    autograd::record("gather_rows", {x}, {out}, [rows, N, H](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::zeros({N, H});
      for (size_t p = 0; p < rows.size(); ++p) {
        float* d = dx.data<float>() + rows[p] * H;
        const float* s = g[0].data<float>() + static_cast<int64_t>(p) * H;
        for (int64_t j = 0; j < H; ++j) d[j] += s[j];
      }
      return std::vector<Tensor>{dx};
    });
  return out;
}

Tensor combine_rows(const Tensor& y, const std::vector<int64_t>& rows, const Tensor& weights, int64_t n) {
  const int64_t P = static_cast<int64_t>(rows.size());
  TP_CHECK(y.dim() == 2 && y.dtype() == DType::F32 && y.size(0) == P,
           "combine_rows: y must be f32 [{}, width], got {} {}", P, dtype_name(y.dtype()), shape_str(y.shape()));
  TP_CHECK(weights.dtype() == DType::F32 && weights.numel() == P, "combine_rows: {} weights for {} rows",
           weights.numel(), P);
  const int64_t H = y.size(1);
  Tensor out = Tensor::zeros({n, H});
  const float* w = weights.data<float>();
  for (int64_t p = 0; p < P; ++p) {
    TP_CHECK(rows[p] >= 0 && rows[p] < n, "combine_rows: row {} outside [0, {})", rows[p], n);
    float* o = out.data<float>() + rows[p] * H;
    const float* s = y.data<float>() + p * H;
    for (int64_t j = 0; j < H; ++j) o[j] += w[p] * s[j];
  }
  if (autograd::needs_grad({y, weights}))
    autograd::record("combine_rows", {y, weights}, {out}, [y, rows, weights, H](const std::vector<Tensor>& g) {
      const int64_t P = static_cast<int64_t>(rows.size());
      Tensor dy = Tensor::empty({P, H}), dw = Tensor::empty(weights.shape());
      for (int64_t p = 0; p < P; ++p) {
        const float* go = g[0].data<float>() + rows[p] * H;
        const float* s = y.data<float>() + p * H;
        float* d = dy.data<float>() + p * H;
        double dot = 0;
        for (int64_t j = 0; j < H; ++j) {
          d[j] = weights.data<float>()[p] * go[j];
          dot += static_cast<double>(go[j]) * s[j];
        }
        dw.data<float>()[p] = static_cast<float>(dot);
      }
      return std::vector<Tensor>{dy, dw};
    });
  return out;
}

}  // namespace tp::ops
