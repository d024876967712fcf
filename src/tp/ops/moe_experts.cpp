#include "tp/ops/moe_experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/moe_experts_kernels.h"
#include "tp/ops/gemm.h"
#include "tp/ops/ordered_gemm.h"
#include "tp/ops/shape.h"

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

// C [m, n] = A [m, k] · B^T (B stored [n, k]) or A · B (B stored [k, n]), plus bias [n] when given.
void gemm_rows(const float* a, const Tensor& b_all, int64_t b_offset_elems, int64_t m, int64_t n, int64_t k,
               bool trans_b, float* c, const float* bias = nullptr) {
  detail::GemmSpec s{.m = m, .n = n, .k = k, .trans_b = trans_b, .a_dtype = DType::F32, .b_dtype = b_all.dtype()};
  const char* b = static_cast<const char*>(b_all.raw_data()) + b_offset_elems * dtype_size(b_all.dtype());
  detail::gemm(s, a, b, bias, c);
}

// An expert's forward product, as gemm_rows computes it; by ordered_gemm where that
// is wanted, so a token's output does not depend on how many others chose the expert.
void expert_rows(const float* a, const Tensor& b_all, int64_t b_offset_elems, int64_t m, int64_t n, int64_t k,
                 bool trans_b, float* c, const float* bias = nullptr) {
  if (!detail::ordered_gemm_wanted()) return gemm_rows(a, b_all, b_offset_elems, m, n, k, trans_b, c, bias);
  const DType dt = b_all.dtype();
  const size_t size = dtype_size(dt);
  const char* b = static_cast<const char*>(b_all.raw_data()) + b_offset_elems * size;
  thread_local std::vector<char> b_rows;
  if (!trans_b) {  // B stored [k, n]: ordered_gemm reads W [n, k]
    b_rows.resize(static_cast<size_t>(n * k) * size);
    for (int64_t r = 0; r < k; ++r)
      for (int64_t j = 0; j < n; ++j) std::memcpy(&b_rows[(j * k + r) * size], b + (r * n + j) * size, size);
    b = b_rows.data();
  }
  detail::ordered_gemm(m, n, k, a, DType::F32, k, b, dt, k, bias, c, n);
}

float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

using Dims = ExpertDims;

// Where expert e's weights and gate/up columns are, and its activation.
struct Layout {
  const ExpertOptions& o;
  Dims d;
  // gu = x gate_up[e]^T (Linear layout, trans_b) or x gate_up[e]; y = a down[e]^T or a down[e].
  bool trans_b() const { return !o.in_by_out; }
  int64_t gate_col(int64_t j) const { return o.interleaved ? 2 * j : j; }
  int64_t up_col(int64_t j) const { return o.interleaved ? 2 * j + 1 : d.I + j; }
  bool clamped() const { return o.swiglu_limit > 0; }
  const float* gate_up_bias(const Tensor& b, int64_t e) const {
    return b.defined() ? b.data<float>() + e * 2 * d.I : nullptr;
  }
  const float* down_bias(const Tensor& b, int64_t e) const {
    return b.defined() && o.add_down_bias ? b.data<float>() + e * d.H : nullptr;
  }
};

// The activation of one (gate, up) pair and, for the backward, its derivatives.
struct Act {
  float a, da_dg, da_du;
};
Act activate(const Layout& l, float g, float u) {
  if (!l.clamped()) {
    const float s = sigmoid(g);
    return {g * s * u, u * (s + g * s * (1.f - s)), g * s};
  }
  // GPT-OSS: gate clamped from above, up from both sides; the clamp passes no gradient outside its range.
  const float L = l.o.swiglu_limit, al = l.o.swiglu_alpha;
  const float gc = std::min(g, L), uc = std::clamp(u, -L, L);
  const float s = sigmoid(al * gc), glu = gc * s;
  return {(uc + 1.f) * glu, g <= L ? (uc + 1.f) * (s + al * gc * s * (1.f - s)) : 0.f, u >= -L && u <= L ? glu : 0.f};
}

// One expert's activations for its c pairs, recomputed by the backward.
struct ExpertPass {
  std::vector<float> x;   // [c, H] the tokens
  std::vector<float> gu;  // [c, 2I] gate and up (the layout's column order), biases added
  std::vector<float> a;   // [c, I] the activation
  std::vector<float> y;   // [c, H] the expert's output (unweighted)
};

// rows [m, n] = a [m, k] . W^T (+ bias [n]) for a packed expert weight W [n, k] (QuantizedLinear's kernels). The
// first `decodes` rows are decode steps' (ExpertOptions::decode_tokens): flagged as such, decode's kernels
// whatever their number; the others, a prompt's, by their count: decode's kernels too where they are faster
// (QuantizedLinear::decode_rows_limit: an expert's share of a prompt is often a few rows; bench_matmul
// --benchmark_filter=expert_rows compares the two), else prefill's
// dequantize-and-GEMM in `compute`'s arithmetic. (So a prompt token's bits depend on whether its expert has more
// prompt rows than that in its step; decode steps' do not: ExpertOptions::decode_tokens.)
void packed_rows(const float* a, const QuantizedLinear& w, int64_t m, int64_t decodes, float* rows, const float* bias,
                 DType compute) {
  const int64_t n = w.out_features(), k = w.in_features();
  Tensor x = Tensor::empty({m, k}), b, y = Tensor::empty({m, n});
  std::memcpy(x.data<float>(), a, static_cast<size_t>(m * k) * sizeof(float));
  if (bias != nullptr) {
    b = Tensor::empty({n});
    std::memcpy(b.data<float>(), bias, static_cast<size_t>(n) * sizeof(float));
  }
  // Rows flagged as decode steps take decode's kernels: the decode steps, and a prompt's rows when they are few.
  std::vector<uint8_t> decode_rows(static_cast<size_t>(m), m - decodes <= w.decode_rows_limit() ? 1 : 0);
  std::fill_n(decode_rows.begin(), decodes, uint8_t{1});
  linear_into(y, x, w, b, compute, decode_rows);
  std::memcpy(rows, y.data<float>(), static_cast<size_t>(m * n) * sizeof(float));
}

// `decodes`: how many of the pairs, the first, are decode steps' (packed experts; packed_rows).
void run_expert(ExpertPass& p, const float* x, const int64_t* pairs, int64_t c, int64_t decodes, const Layout& l,
                const Tensor& gate_up, const Tensor& down, const Tensor& gate_up_bias, const Tensor& down_bias,
                int64_t e) {
  const int64_t K = l.d.K, H = l.d.H, I = l.d.I;
  const bool packed = l.o.packed_gate_up != nullptr;
  p.x.resize(static_cast<size_t>(c * H));
  for (int64_t i = 0; i < c; ++i) std::memcpy(&p.x[i * H], x + (pairs[i] / K) * H, H * sizeof(float));
  p.gu.resize(static_cast<size_t>(c * 2 * I));
  if (packed && l.o.packed_up != nullptr) {  // gate and up apart: each into its columns of gu
    p.a.resize(static_cast<size_t>(c * 2 * I));
    packed_rows(p.x.data(), (*l.o.packed_gate_up)[e], c, decodes, p.a.data(), nullptr, l.o.packed_compute);
    packed_rows(p.x.data(), (*l.o.packed_up)[e], c, decodes, p.a.data() + c * I, nullptr, l.o.packed_compute);
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < I; ++j) {
        p.gu[i * 2 * I + l.gate_col(j)] = p.a[i * I + j];
        p.gu[i * 2 * I + l.up_col(j)] = p.a[c * I + i * I + j];
      }
  } else if (packed) {
    packed_rows(p.x.data(), (*l.o.packed_gate_up)[e], c, decodes, p.gu.data(), l.gate_up_bias(gate_up_bias, e),
                l.o.packed_compute);
  } else {
    expert_rows(p.x.data(), gate_up, e * 2 * I * H, c, 2 * I, H, l.trans_b(), p.gu.data(),
                l.gate_up_bias(gate_up_bias, e));
  }
  p.a.resize(static_cast<size_t>(c * I));
  if (!l.clamped() && !l.o.interleaved) {  // Mixtral / Qwen3-MoE: the plain loop, as before the options
    parallel_region(c * I > 32768, [&] {
#pragma omp for
      for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < I; ++j) {
          const float g = p.gu[i * 2 * I + j];
          p.a[i * I + j] = g * sigmoid(g) * p.gu[i * 2 * I + I + j];
        }
    });
  } else {
    parallel_region(c * I > 32768, [&] {
#pragma omp for
      for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < I; ++j)
          p.a[i * I + j] = activate(l, p.gu[i * 2 * I + l.gate_col(j)], p.gu[i * 2 * I + l.up_col(j)]).a;
    });
  }
  p.y.resize(static_cast<size_t>(c * H));
  if (packed)
    packed_rows(p.a.data(), (*l.o.packed_down)[e], c, decodes, p.y.data(), l.down_bias(down_bias, e),
                l.o.packed_compute);
  else
    expert_rows(p.a.data(), down, e * H * I, c, H, I, l.trans_b(), p.y.data(), l.down_bias(down_bias, e));
}

// The biases against E experts of intermediate size I; the dims.
Dims check_biases(const Tensor& x, const Tensor& ids, const ExpertOptions& o, int64_t E, int64_t I) {
  const int64_t H = x.size(1);
  TP_CHECK(!o.gate_up_bias.defined() || o.gate_up_bias.shape() == (Shape{E, 2 * I}),
           "moe_experts: gate_up_proj_bias must be {}, got {}", shape_str(Shape{E, 2 * I}),
           shape_str(o.gate_up_bias.shape()));
  TP_CHECK(!o.down_bias.defined() || o.down_bias.shape() == (Shape{E, H}),
           "moe_experts: down_proj_bias must be {}, got {}", shape_str(Shape{E, H}), shape_str(o.down_bias.shape()));
  return {x.size(0), H, ids.size(1), E, I};
}

Dims check_shapes(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                  const Tensor& down, const ExpertOptions& o) {
  TP_CHECK(x.dim() == 2 && x.dtype() == DType::F32, "moe_experts: x must be f32 [tokens, hidden], got {} {}",
           dtype_name(x.dtype()), shape_str(x.shape()));
  TP_CHECK(ids.dim() == 2 && ids.dtype() == DType::I64 && ids.size(0) == x.size(0),
           "moe_experts: ids must be i64 [{}, top_k], got {} {}", x.size(0), dtype_name(ids.dtype()),
           shape_str(ids.shape()));
  TP_CHECK(weights.dtype() == DType::F32 && weights.shape() == ids.shape(),
           "moe_experts: weights must be f32 {} like the ids, got {} {}", shape_str(ids.shape()),
           dtype_name(weights.dtype()), shape_str(weights.shape()));
  if (o.packed_gate_up != nullptr) {
    TP_CHECK(o.packed_down != nullptr && o.packed_down->size() == o.packed_gate_up->size() &&
                 !o.packed_gate_up->empty() && !gate_up.defined() && !down.defined(),
             "moe_experts: packed experts need as many packed down_proj as gate_up_proj (got {} and {}) and no "
             "gate_up / down tensors", o.packed_gate_up->size(), o.packed_down ? o.packed_down->size() : 0);
    const int64_t E = static_cast<int64_t>(o.packed_gate_up->size()), H = x.size(1);
    const bool apart = o.packed_up != nullptr;  // gate and up apart: each [I, H]
    const int64_t I = (*o.packed_gate_up)[0].out_features() / (apart ? 1 : 2);
    TP_CHECK(!apart || (o.packed_up->size() == o.packed_gate_up->size() && !o.gate_up_bias.defined()),
             "moe_experts: packed gate and up apart need one up a gate ({} and {}) and no gate_up bias",
             o.packed_gate_up->size(), o.packed_up->size());
    for (int64_t e = 0; e < E; ++e) {
      const QuantizedLinear &gu = (*o.packed_gate_up)[e], &dn = (*o.packed_down)[e];
      const int64_t rows = apart ? I : 2 * I;
      TP_CHECK(gu.out_features() == rows && gu.in_features() == H && dn.out_features() == H && dn.in_features() == I &&
                   (!apart || ((*o.packed_up)[e].out_features() == I && (*o.packed_up)[e].in_features() == H)),
               "moe_experts: packed expert {} is gate{} [{}, {}] and down [{}, {}], expected [{}, {}] and [{}, {}]", e,
               apart ? "" : "_up", gu.out_features(), gu.in_features(), dn.out_features(), dn.in_features(), rows, H,
               H, I);
    }
    return check_biases(x, ids, o, E, I);
  }
  const int64_t h_dim = o.in_by_out ? 1 : 2, i_dim = 3 - h_dim;
  TP_CHECK(gate_up.dim() == 3 && gate_up.size(h_dim) == x.size(1) && gate_up.size(i_dim) % 2 == 0,
           "moe_experts: gate_up_proj must be {}, got {}",
           o.in_by_out ? fmt::format("[experts, {}, 2 x intermediate]", x.size(1))
                       : fmt::format("[experts, 2 x intermediate, {}]", x.size(1)),
           shape_str(gate_up.shape()));
  const int64_t E = gate_up.size(0), H = x.size(1), I = gate_up.size(i_dim) / 2;
  const Shape want_down = o.in_by_out ? Shape{E, I, H} : Shape{E, H, I};
  TP_CHECK(down.shape() == want_down, "moe_experts: down_proj must be {} to match gate_up_proj {}, got {}",
           shape_str(want_down), shape_str(gate_up.shape()), shape_str(down.shape()));
  return check_biases(x, ids, o, E, I);
}

// ---- CPU kernels: the experts

// Each expert's pairs through run_expert, weighted into their tokens' rows.
void experts_forward_cpu(const Dims& d, const Tensor& x, const Tensor& ids, const Tensor& weights,
                         const Tensor& gate_up, const Tensor& down, const ExpertOptions& opt, const Tensor& out) {
  const Layout layout{opt, d};
  Groups groups = group_by_expert(ids, d.E);
  float* o = out.data<float>();
  const float* w = weights.data<float>();
  const bool kinds = opt.packed_gate_up != nullptr && !opt.decode_tokens.empty();
  ExpertPass pass;
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t c = groups.offsets[e + 1] - groups.offsets[e];
    if (c == 0) continue;
    int64_t* pairs = &groups.pairs[static_cast<size_t>(groups.offsets[e])];
    int64_t decodes = 0;
    if (kinds)  // decode steps' pairs first (a token's sum adds its experts in expert order: the same bits)
      decodes = std::stable_partition(pairs, pairs + c,
                                      [&](int64_t pair) { return opt.decode_tokens[pair / d.K] != 0; }) - pairs;
    run_expert(pass, x.data<float>(), pairs, c, decodes, layout, gate_up, down, opt.gate_up_bias, opt.down_bias,
               e);
    for (int64_t i = 0; i < c; ++i) {
      float* row = o + (pairs[i] / d.K) * d.H;
      const float wi = w[pairs[i]];
      const float* y = &pass.y[i * d.H];
      for (int64_t j = 0; j < d.H; ++j) row[j] += wi * y[j];
    }
  }
}

// Each expert's pairs run again (run_expert), then back through the activation and both products.
void experts_backward_cpu(const Dims& d, const Tensor& x, const Tensor& ids, const Tensor& weights,
                          const Tensor& gu32, const Tensor& dn32, const ExpertOptions& saved, const Tensor& dout_t,
                          const Tensor& dx, const Tensor& dw, const Tensor& dgu, const Tensor& ddown,
                          const Tensor& dgub, const Tensor& ddb) {
  const Layout l{saved, d};
  const bool tb = l.trans_b();
  const Groups groups = group_by_expert(ids, d.E);
  const float* dout = dout_t.data<float>();
  const float* w = weights.data<float>();
  ExpertPass pass;
  std::vector<float> dy, da, dg, dxe;
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t c = groups.offsets[e + 1] - groups.offsets[e];
    if (c == 0) continue;
    const int64_t* pairs = &groups.pairs[static_cast<size_t>(groups.offsets[e])];
    run_expert(pass, x.data<float>(), pairs, c, 0, l, gu32, dn32, saved.gate_up_bias, saved.down_bias, e);
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
    if (l.down_bias(saved.down_bias, e) != nullptr) {
      float* b = ddb.data<float>() + e * d.H;
      for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < d.H; ++j) b[j] += dy[i * d.H + j];
    }
    // y = a down^T (Linear layout: down [H, I]) or a down (down [I, H]):
    // da = dy down or dy down^T; ddown += dy^T a or a^T dy.
    da.resize(static_cast<size_t>(c * d.I));
    gemm_rows(dy.data(), dn32, e * d.H * d.I, c, d.I, d.H, !tb, da.data());
    float* ddown_e = ddown.data<float>() + e * d.H * d.I;
    if (tb)
      detail::gemm({.m = d.H, .n = d.I, .k = c, .trans_a = true, .accumulate = true}, dy.data(), pass.a.data(),
                   nullptr, ddown_e);
    else
      detail::gemm({.m = d.I, .n = d.H, .k = c, .trans_a = true, .accumulate = true}, pass.a.data(), dy.data(),
                   nullptr, ddown_e);
    dg.resize(static_cast<size_t>(c * 2 * d.I));
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < d.I; ++j) {
        float* row = &dg[i * 2 * d.I];
        const Act act = activate(l, pass.gu[i * 2 * d.I + l.gate_col(j)], pass.gu[i * 2 * d.I + l.up_col(j)]);
        row[l.gate_col(j)] = da[i * d.I + j] * act.da_dg;
        row[l.up_col(j)] = da[i * d.I + j] * act.da_du;
      }
    if (saved.gate_up_bias.defined()) {
      float* b = dgub.data<float>() + e * 2 * d.I;
      for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < 2 * d.I; ++j) b[j] += dg[i * 2 * d.I + j];
    }
    // gu = x gate_up^T or x gate_up: dx = dg gate_up or dg gate_up^T; dgate_up += dg^T x or x^T dg.
    dxe.resize(static_cast<size_t>(c * d.H));
    gemm_rows(dg.data(), gu32, e * 2 * d.I * d.H, c, d.H, 2 * d.I, !tb, dxe.data());
    float* dgu_e = dgu.data<float>() + e * 2 * d.I * d.H;
    if (tb)
      detail::gemm({.m = 2 * d.I, .n = d.H, .k = c, .trans_a = true, .accumulate = true}, dg.data(),
                   pass.x.data(), nullptr, dgu_e);
    else
      detail::gemm({.m = d.H, .n = 2 * d.I, .k = c, .trans_a = true, .accumulate = true}, pass.x.data(),
                   dg.data(), nullptr, dgu_e);
    for (int64_t i = 0; i < c; ++i) {
      float* row = dx.data<float>() + (pairs[i] / d.K) * d.H;
      for (int64_t j = 0; j < d.H; ++j) row[j] += dxe[i * d.H + j];
    }
  }
}

Tensor f32_or_undefined(const Tensor& t) { return !t.defined() || t.dtype() == DType::F32 ? t : t.to(DType::F32); }
Tensor as_dtype_of(const Tensor& grad, const Tensor& like) {
  return like.dtype() == DType::F32 ? grad : grad.to(like.dtype());
}

}  // namespace

ExpertOptions ExpertOptions::gpt_oss(float limit, float alpha) {
  return {.in_by_out = true, .interleaved = true, .swiglu_limit = limit, .swiglu_alpha = alpha};
}

Tensor moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                   const Tensor& down, const ExpertOptions& opt) {
  const Dims d = check_shapes(x, ids, weights, gate_up, down, opt);
  TP_CHECK(opt.decode_tokens.empty() || static_cast<int64_t>(opt.decode_tokens.size()) == d.N,
           "moe_experts: decode_tokens flags {} tokens of {}", opt.decode_tokens.size(), d.N);
  ExpertOptions saved = opt;  // the biases in f32
  saved.gate_up_bias = f32_or_undefined(opt.gate_up_bias);
  saved.down_bias = f32_or_undefined(opt.down_bias);
  Tensor out = Tensor::zeros({d.N, d.H});
  moe_experts_kernels()
      .on(x, ids, weights, gate_up, down, saved.gate_up_bias, saved.down_bias, out)
      .forward(d, x, ids, weights, gate_up, down, saved, out);
  saved.decode_tokens = {};  // the caller's flags, for this call alone
  std::vector<Tensor> inputs = {x, weights, gate_up, down};
  if (opt.gate_up_bias.defined()) inputs.push_back(opt.gate_up_bias);
  if (opt.down_bias.defined()) inputs.push_back(opt.down_bias);
  if (!autograd::needs_grad(inputs)) return out;
  TP_CHECK(opt.packed_gate_up == nullptr,
           "moe_experts: packed experts (MXFP4, or a quantized checkpoint's) are for inference: they take no "
           "gradient");
  autograd::record(
      "moe_experts", inputs, {out},
      [x, ids, weights, gate_up, down, saved, opt, d](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        // The weights' gradients are computed in f32 (a trainer's masters are f32).
        const Tensor gu32 = gate_up.to(DType::F32), dn32 = down.to(DType::F32);
        Tensor dx = Tensor::zeros({d.N, d.H}), dw = Tensor::zeros({d.N, d.K});
        Tensor dgu = Tensor::zeros(gate_up.shape()), ddown = Tensor::zeros(down.shape());
        Tensor dgub = Tensor::zeros({d.E, 2 * d.I}), ddb = Tensor::zeros({d.E, d.H});
        moe_experts_kernels()
            .on(x, ids, weights, gu32, dn32, grads[0])
            .backward(d, x, ids, weights, gu32, dn32, saved, grads[0], dx, dw, dgu, ddown, dgub, ddb);
        std::vector<Tensor> out = {dx, dw, as_dtype_of(dgu, gate_up), as_dtype_of(ddown, down)};
        if (opt.gate_up_bias.defined()) out.push_back(as_dtype_of(dgub, opt.gate_up_bias));
        if (opt.down_bias.defined()) out.push_back(as_dtype_of(ddb, opt.down_bias));
        return out;
      });
  return out;
}

Tensor routed_bias(const Tensor& ids, const Tensor& weights, const Tensor& bias) {
  TP_CHECK(ids.dim() == 2 && ids.dtype() == DType::I64 && weights.shape() == ids.shape() && bias.dim() == 2,
           "routed_bias: ids i64 [N, K], weights [N, K] and bias [E, H] expected, got {}, {} and {}",
           shape_str(ids.shape()), shape_str(weights.shape()), shape_str(bias.shape()));
  const int64_t N = ids.size(0), K = ids.size(1), E = bias.size(0);
  const int64_t* id = ids.data<int64_t>();
  std::vector<int64_t> experts, tokens, slots;
  for (int64_t p = 0; p < N * K; ++p) {
    TP_CHECK(id[p] >= 0 && id[p] <= E, "routed_bias: expert id {} outside [0, {}]", id[p], E);
    if (id[p] == E) continue;
    experts.push_back(id[p]);
    tokens.push_back(p / K);
    slots.push_back(p);
  }
  const Tensor b = bias.dtype() == DType::F32 ? bias : to_dtype(bias, DType::F32);
  const Tensor w = gather_rows(reshape(weights, {N * K, 1}), slots);
  return combine_rows(gather_rows(b, experts), tokens, reshape(w, {-1}), N);
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

namespace {

// ---- CPU kernels: the routers

void route_top_k_cpu(const Tensor& logits, const Tensor& bias, const RouterScoring& sc, const Tensor& probs,
                     const Tensor& weights, const Tensor& ids, const Tensor& sums_t) {
  const int64_t N = logits.size(0), E = logits.size(1), k = sc.top_k;
  const int64_t G = sc.n_group, per_group = E / G;
  float* sums = sums_t.data<float>();
  const float* l = logits.data<float>();
  const float* bs = bias.defined() ? bias.data<float>() : nullptr;
  float* p = probs.data<float>();
  float* w = weights.data<float>();
  int64_t* id = ids.data<int64_t>();
  parallel_for(N, N * E > 65536, [&](int64_t n) {
    const float* row = l + n * E;
    float* pr = p + n * E;
    if (sc.sigmoid) {
      for (int64_t e = 0; e < E; ++e) pr[e] = 1.f / (1.f + std::exp(-row[e]));
    } else {
      softmax_row(row, E, pr);
    }
    std::vector<float> choice(pr, pr + E);
    if (bs != nullptr)
      for (int64_t e = 0; e < E; ++e) choice[e] += bs[e];
    // taken: chosen already, or in a group that is not kept.
    std::vector<bool> taken(static_cast<size_t>(E), false);
    if (G > 1) {
      std::vector<float> score(static_cast<size_t>(G));
      for (int64_t g = 0; g < G; ++g) {
        const float* c = choice.data() + g * per_group;
        float first = -INFINITY, second = -INFINITY;
        for (int64_t j = 0; j < per_group; ++j)
          if (c[j] > first)
            second = first, first = c[j];
          else if (c[j] > second)
            second = c[j];
        score[g] = sc.group_sum_top2 ? first + (per_group > 1 ? second : 0.f) : first;
      }
      std::vector<bool> kept(static_cast<size_t>(G), false);
      for (int64_t j = 0; j < sc.topk_group; ++j) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g)
          if (!kept[g] && (best < 0 || score[g] > score[best])) best = g;
        kept[best] = true;
      }
      for (int64_t e = 0; e < E; ++e) taken[e] = !kept[e / per_group];
    }
    // k passes of a max over E (k is small: 2 for Mixtral, 8 for Qwen3-30B-A3B and DeepSeek-V3).
    double s = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
      taken[best] = true;
      id[n * k + j] = best;
      w[n * k + j] = pr[best];
      s += pr[best];
    }
    // DeepSeek-V3 adds 1e-20 to the sum (sigmoid scores need not sum to anything); a no-op in f32 otherwise.
    sums[n] = static_cast<float>(s + (sc.sigmoid ? 1e-20 : 0.0));
    for (int64_t j = 0; j < k; ++j)
      w[n * k + j] = static_cast<float>((sc.renormalize ? w[n * k + j] / sums[n] : w[n * k + j]) * sc.scaling);
  });
}

void route_top_k_backward_cpu(const Tensor& logits, const Tensor& probs, const Tensor& weights, const Tensor& ids,
                              const Tensor& sums_t, const RouterScoring& sc, const Tensor& dweights,
                              const Tensor& dlogits) {
  const int64_t N = logits.size(0), E = logits.size(1), k = sc.top_k;
  const float* dw = dweights.data<float>();
  const float* lg = logits.data<float>();
  const float* w = weights.data<float>();
  const float* p = probs.data<float>();
  const int64_t* id = ids.data<int64_t>();
  const float* sums = sums_t.data<float>();
  float* d = dlogits.data<float>();
  const double scale = sc.scaling;
  for (int64_t n = 0; n < N; ++n) {
    // w = c p_sel / S (c = scaling):  dp_j = c (dw_j - sum_i dw_i w_i / c) / S; without renormalising c dw_j.
    double dot = 0;
    if (sc.renormalize)
      for (int64_t j = 0; j < k; ++j) dot += dw[n * k + j] * w[n * k + j] / scale;
    std::vector<float> dp(static_cast<size_t>(E), 0.f);
    for (int64_t j = 0; j < k; ++j)
      dp[id[n * k + j]] = static_cast<float>(
          sc.renormalize ? scale * (dw[n * k + j] - dot) / sums[n] : scale * dw[n * k + j]);
    if (sc.sigmoid) {  // dl_e = sigmoid(l_e) sigmoid(-l_e) dp_e (not p (1 - p): exact when saturated)
      for (int64_t e = 0; e < E; ++e)
        d[n * E + e] = p[n * E + e] * (1.f / (1.f + std::exp(lg[n * E + e]))) * dp[e];
      continue;
    }
    // softmax: dl_e = p_e (dp_e - sum_i dp_i p_i) = p_e (dp_e sum_{i != e} p_i - sum_{i != e} dp_i p_i)
    // (sum_i p_i = 1). For the k chosen e the second form is used: with a
    // saturated router (p_e near 1) the first subtracts two numbers near dp_e
    // and loses their small difference (tp ranks then disagree in it).
    const float* pn = p + n * E;
    double inner = 0;
    for (int64_t j = 0; j < k; ++j) inner += static_cast<double>(dp[id[n * k + j]]) * pn[id[n * k + j]];
    for (int64_t e = 0; e < E; ++e) d[n * E + e] = static_cast<float>(-pn[e] * inner);  // dp_e = 0
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = id[n * k + j];
      double others = 0, others_dp = 0;  // sum_{i != e} p_i (no cancellation: terms summed directly)
      for (int64_t i = 0; i < E; ++i)
        if (i != e) others += pn[i];
      for (int64_t i = 0; i < k; ++i)
        if (id[n * k + i] != e) others_dp += static_cast<double>(dp[id[n * k + i]]) * pn[id[n * k + i]];
      d[n * E + e] = static_cast<float>(pn[e] * (dp[e] * others - others_dp));
    }
  }
}

void top_k_softmax_cpu(const Tensor& logits, const Tensor& weights, const Tensor& ids) {
  const int64_t N = logits.size(0), E = logits.size(1), k = weights.size(1);
  const float* l = logits.data<float>();
  float* w = weights.data<float>();
  int64_t* id = ids.data<int64_t>();
  parallel_for(N, N * E > 65536, [&](int64_t n) {
    const float* row = l + n * E;
    std::vector<bool> taken(static_cast<size_t>(E), false);
    for (int64_t j = 0; j < k; ++j) {  // in descending order, as torch.topk: the first is the largest
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || row[e] > row[best])) best = e;
      taken[best] = true;
      id[n * k + j] = best;
    }
    const float mx = row[id[n * k]];
    double z = 0;
    for (int64_t j = 0; j < k; ++j) z += w[n * k + j] = std::exp(row[id[n * k + j]] - mx);
    for (int64_t j = 0; j < k; ++j) w[n * k + j] = static_cast<float>(w[n * k + j] / z);
  });
}

void top_k_softmax_backward_cpu(const Tensor& weights, const Tensor& ids, const Tensor& dweights,
                                const Tensor& dlogits) {
  const int64_t N = weights.size(0), E = dlogits.size(1), k = weights.size(1);
  const float* dw = dweights.data<float>();
  const float* w = weights.data<float>();
  const int64_t* id = ids.data<int64_t>();
  float* d = dlogits.data<float>();
  for (int64_t n = 0; n < N; ++n) {  // softmax over the k: dl_j = w_j (dw_j - sum_i dw_i w_i); others 0
    double dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += dw[n * k + j] * w[n * k + j];
    for (int64_t j = 0; j < k; ++j)
      d[n * E + id[n * k + j]] = static_cast<float>(w[n * k + j] * (dw[n * k + j] - dot));
  }
}

constexpr RoutingKernels kCpuRoutingKernels{route_top_k_cpu, route_top_k_backward_cpu, top_k_softmax_cpu,
                                            top_k_softmax_backward_cpu};

}  // namespace

KernelTable<RoutingKernels>& routing_kernels() {
  static KernelTable<RoutingKernels> table("route_top_k", &kCpuRoutingKernels);
  return table;
}

TopK route_top_k(const Tensor& logits, const RouterScoring& sc, const Tensor& bias) {
  TP_CHECK(logits.dim() == 2 && logits.dtype() == DType::F32, "route_top_k: logits must be f32 [tokens, experts], "
           "got {} {}", dtype_name(logits.dtype()), shape_str(logits.shape()));
  const int64_t N = logits.size(0), E = logits.size(1), k = sc.top_k;
  TP_CHECK(k >= 1 && k <= E, "route_top_k: top_k {} must be in [1, {}] (the number of experts)", k, E);
  TP_CHECK(sc.n_group >= 1 && E % sc.n_group == 0 && sc.topk_group >= 1 && sc.topk_group <= sc.n_group,
           "route_top_k: {} experts cannot form n_group {} groups of which topk_group {} are kept", E, sc.n_group,
           sc.topk_group);
  TP_CHECK(k <= sc.topk_group * (E / sc.n_group),
           "route_top_k: top_k {} is more than the {} experts of the topk_group {} kept groups", k,
           sc.topk_group * (E / sc.n_group), sc.topk_group);
  TP_CHECK(!bias.defined() || (bias.dtype() == DType::F32 && bias.numel() == E),
           "route_top_k: the choice bias must be f32 [{}], got {} {}", E, dtype_name(bias.dtype()),
           shape_str(bias.shape()));
  Tensor probs = Tensor::empty({N, E}), weights = Tensor::empty({N, k}), ids = Tensor::empty({N, k}, DType::I64);
  Tensor sums = Tensor::empty({N});
  routing_kernels().on(logits, bias).route_top_k(logits, bias, sc, probs, weights, ids, sums);
  if (autograd::needs_grad({logits}))
    autograd::record("route_top_k", {logits}, {weights}, [logits, probs, weights, ids, sums, sc, N, E](
                                                             const std::vector<Tensor>& g) {
      Tensor dl = Tensor::zeros({N, E});
      routing_kernels().on(g[0], logits).route_top_k_backward(logits, probs, weights, ids, sums, sc, g[0], dl);
      return std::vector<Tensor>{dl};
    });
  return {weights, ids};
}

TopK softmax_top_k(const Tensor& logits, int64_t k, bool renormalize) {
  return route_top_k(logits, RouterScoring{.top_k = k, .renormalize = renormalize});
}

}  // namespace tp::ops

namespace tp::ops {

TopK top_k_softmax(const Tensor& logits, int64_t k) {
  TP_CHECK(logits.dim() == 2 && logits.dtype() == DType::F32, "top_k_softmax: logits must be f32 [tokens, experts], "
           "got {} {}", dtype_name(logits.dtype()), shape_str(logits.shape()));
  const int64_t N = logits.size(0), E = logits.size(1);
  TP_CHECK(k >= 1 && k <= E, "top_k_softmax: top_k {} must be in [1, {}] (the number of experts)", k, E);
  Tensor weights = Tensor::empty({N, k}), ids = Tensor::empty({N, k}, DType::I64);
  routing_kernels().on(logits).top_k_softmax(logits, weights, ids);
  if (autograd::needs_grad({logits}))
    autograd::record("top_k_softmax", {logits}, {weights}, [weights, ids, N, E](const std::vector<Tensor>& g) {
      Tensor dl = Tensor::zeros({N, E});
      routing_kernels().on(g[0], weights).top_k_softmax_backward(weights, ids, g[0], dl);
      return std::vector<Tensor>{dl};
    });
  return {weights, ids};
}

}  // namespace tp::ops

namespace tp::ops {

namespace {

// ---- CPU kernels: the row gathers and combines

void gather_rows_cpu(const Tensor& x, const std::vector<int64_t>& rows, const Tensor& out) {
  const int64_t H = x.size(1), P = static_cast<int64_t>(rows.size());
  for (int64_t p = 0; p < P; ++p)
    std::memcpy(out.data<float>() + p * H, x.data<float>() + rows[p] * H, H * sizeof(float));
}

void gather_rows_backward_cpu(const Tensor& g, const std::vector<int64_t>& rows, const Tensor& dx) {
  const int64_t H = dx.size(1);
  for (size_t p = 0; p < rows.size(); ++p) {
    float* d = dx.data<float>() + rows[p] * H;
    const float* s = g.data<float>() + static_cast<int64_t>(p) * H;
    for (int64_t j = 0; j < H; ++j) d[j] += s[j];
  }
}

void combine_rows_cpu(const Tensor& y, const std::vector<int64_t>& rows, const Tensor& weights, const Tensor& out) {
  const int64_t H = y.size(1), P = static_cast<int64_t>(rows.size());
  const float* w = weights.data<float>();
  for (int64_t p = 0; p < P; ++p) {
    float* o = out.data<float>() + rows[p] * H;
    const float* s = y.data<float>() + p * H;
    for (int64_t j = 0; j < H; ++j) o[j] += w[p] * s[j];
  }
}

void combine_rows_backward_cpu(const Tensor& g, const Tensor& y, const std::vector<int64_t>& rows,
                               const Tensor& weights, const Tensor& dy, const Tensor& dw) {
  const int64_t H = y.size(1), P = static_cast<int64_t>(rows.size());
  for (int64_t p = 0; p < P; ++p) {
    const float* go = g.data<float>() + rows[p] * H;
    const float* s = y.data<float>() + p * H;
    float* d = dy.data<float>() + p * H;
    double dot = 0;
    for (int64_t j = 0; j < H; ++j) {
      d[j] = weights.data<float>()[p] * go[j];
      dot += static_cast<double>(go[j]) * s[j];
    }
    dw.data<float>()[p] = static_cast<float>(dot);
  }
}

constexpr MoeExpertsKernels kCpuMoeExpertsKernels{experts_forward_cpu, experts_backward_cpu,
                                                  gather_rows_cpu,     gather_rows_backward_cpu,
                                                  combine_rows_cpu,    combine_rows_backward_cpu};

}  // namespace

KernelTable<MoeExpertsKernels>& moe_experts_kernels() {
  static KernelTable<MoeExpertsKernels> table("moe_experts", &kCpuMoeExpertsKernels);
  return table;
}

Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows) {
  TP_CHECK(x.dim() == 2 && x.dtype() == DType::F32, "gather_rows: x must be f32 [rows, width], got {} {}",
           dtype_name(x.dtype()), shape_str(x.shape()));
  const int64_t N = x.size(0), H = x.size(1), P = static_cast<int64_t>(rows.size());
  for (int64_t p = 0; p < P; ++p)
    TP_CHECK(rows[p] >= 0 && rows[p] < N, "gather_rows: row {} outside [0, {})", rows[p], N);
  Tensor out = Tensor::empty({P, H});
  moe_experts_kernels().on(x, out).gather_rows(x, rows, out);
  if (autograd::needs_grad({x}))
    autograd::record("gather_rows", {x}, {out}, [rows, N, H](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::zeros({N, H});
      moe_experts_kernels().on(g[0], dx).gather_rows_backward(g[0], rows, dx);
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
  for (int64_t p = 0; p < P; ++p)
    TP_CHECK(rows[p] >= 0 && rows[p] < n, "combine_rows: row {} outside [0, {})", rows[p], n);
  const int64_t H = y.size(1);
  Tensor out = Tensor::zeros({n, H});
  moe_experts_kernels().on(y, weights, out).combine_rows(y, rows, weights, out);
  if (autograd::needs_grad({y, weights}))
    autograd::record("combine_rows", {y, weights}, {out}, [y, rows, weights, H](const std::vector<Tensor>& g) {
      const int64_t P = static_cast<int64_t>(rows.size());
      Tensor dy = Tensor::empty({P, H}), dw = Tensor::empty(weights.shape());
      moe_experts_kernels().on(g[0], y, weights).combine_rows_backward(g[0], y, rows, weights, dy, dw);
      return std::vector<Tensor>{dy, dw};
    });
  return out;
}

}  // namespace tp::ops
