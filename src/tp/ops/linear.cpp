#include "tp/ops/linear.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tp/autograd/checkpoint.h"
#include "tp/autograd/grad_state.h"
#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/bf16_rounding.h"
#include "tp/ops/detail/bf16_gemv.h"
#include "tp/ops/detail/bf16_pairs.h"
#include "tp/ops/detail/dnnl_context.h"
#include "tp/ops/detail/linear_kernels.h"
#include "tp/ops/gemm.h"
#include "tp/ops/ordered_gemm.h"
#include "tp/tensor/convert.h"
#include "tp/tensor/storage.h"

namespace tp::ops {

namespace {

using dnnl::memory;
using detail::GemmSpec;

// Product of all but the last dim (works for K = 0 too).
int64_t rows_of(const Tensor& x) {
  int64_t m = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) m *= x.size(i);
  return m;
}

// Checks x [..., K] against a weight of shape w [N, K] (and b [N]); returns the row count M.
// A bf16 x is taken (as is, no rounding pass) only by a bf16 packed weight.
int64_t check_linear_args(const Tensor& x, const Shape& w, DType w_dtype, const Tensor& b, bool bf16_x_ok = false) {
  TP_CHECK(x.defined(), "linear: input must be defined");
  TP_CHECK(w.size() == 2, "linear: weight must be 2-D [out, in], got shape {}", shape_str(w));
  TP_CHECK(x.dim() >= 1 && x.size(-1) == w[1],
           "linear: input shape {} does not match weight shape {} (input's last dim must equal weight's dim 1)",
           shape_str(x.shape()), shape_str(w));
  TP_CHECK(x.dtype() == DType::F32 || (bf16_x_ok && x.dtype() == DType::BF16 && w_dtype == DType::BF16),
           "linear: input must be f32 (or bf16 into a packed bf16 weight), got {} (weight {})",
           dtype_name(x.dtype()), dtype_name(w_dtype));
  TP_CHECK(w_dtype == DType::F32 || w_dtype == DType::BF16, "linear: weight must be f32 or bf16, got {}",
           dtype_name(w_dtype));
  if (b.defined()) {
    TP_CHECK(b.dim() == 1 && b.size(0) == w[0], "linear: bias shape {} does not match weight shape {}",
             shape_str(b.shape()), shape_str(w));
    TP_CHECK(is_floating(b.dtype()), "linear: bias must be floating point, got {}", dtype_name(b.dtype()));
  }
  return rows_of(x);
}

Shape linear_out_shape(const Tensor& x, int64_t n) {
  Shape s = x.shape();
  s.back() = n;
  return s;
}

// ---- CPU kernels: the dense products (the packed one follows PackedLinear::State)

void linear_cpu(const Tensor& x, const Tensor& w, const Tensor& bias, bool batch_invariant, const Tensor& y) {
  const int64_t m = rows_of(x), n = w.size(0), k = w.size(1);
  const float* bias_ptr = bias.defined() ? bias.data<float>() : nullptr;
  if (batch_invariant) {
    detail::ordered_gemm(m, n, k, x.raw_data(), DType::F32, k, w.raw_data(), w.dtype(), k, bias_ptr, y.data<float>(),
                         n);
  } else {
    detail::gemm({m, n, k, false, true, DType::F32, w.dtype()}, x.raw_data(), w.raw_data(), bias_ptr,
                 y.data<float>());
  }
}

void linear_backward_cpu(const Tensor& dy, const Tensor& w, const Tensor& x, bool accumulate, const Tensor& dx,
                         const Tensor& dw) {
  const int64_t n = w.size(0), k = w.size(1), m = rows_of(dy);
  if (dx.defined())
    detail::gemm({m, k, n, false, false, dy.dtype(), w.dtype()}, dy.raw_data(), w.raw_data(), nullptr,
                 dx.data<float>());
  if (dw.defined()) {
    detail::GemmSpec spec{n, k, m, true, false, dy.dtype(), x.dtype()};
    spec.accumulate = accumulate;
    detail::gemm(spec, dy.raw_data(), x.raw_data(), nullptr, dw.data<float>());
  }
}

void bias_grad_cpu(const Tensor& dy, const Tensor& db) {
  const int64_t n = db.size(0), m = rows_of(dy);
  float* d = db.data<float>();
  const float* g = dy.data<float>();
  // Columns split over threads; each thread sums its columns over all rows.
  parallel_region(m * n > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
      int64_t j1 = std::min(n, j0 + 64);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = j0; j < j1; ++j) d[j] += g[i * n + j];
    }
  });
}

void matmul_cpu(const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t k = b.size(0), n = b.size(1), m = rows_of(a);
  detail::gemm({m, n, k, false, false, DType::F32, b.dtype()}, a.raw_data(), b.raw_data(), nullptr,
               y.data<float>());
}

void matmul_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& da, const Tensor& db) {
  const int64_t k = b.size(0), n = b.size(1), m = rows_of(a);
  if (da.defined())  // da [M, K] = g [M, N] · b^T
    detail::gemm({m, k, n, false, true, DType::F32, b.dtype()}, g.raw_data(), b.raw_data(), nullptr,
                 da.data<float>());
  if (db.defined())  // db [K, N] = a^T · g
    detail::gemm({k, n, m, true, false, DType::F32, DType::F32}, a.raw_data(), g.raw_data(), nullptr,
                 db.data<float>());
}

// ---- the ops' helpers

Tensor bf16_copy(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), DType::BF16);
  round_to_bf16(x, out);
  return out;
}

// x rounded to bf16 values, still f32 (bf16 arithmetic run as f32 GEMMs).
Tensor bf16_valued_copy(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape());
  round_to_bf16(x, out);
  return out;
}

// dx [M, K] = dy [M, N] · w [N, K];  dw [N, K] = dy^T · x;  db [N] = column sums of dy.
// A bf16 weight means bf16 compute, as under torch.autocast: both products take
// bf16 operands (dy rounded once for the two) and accumulate in f32. With
// `bf16_values`, the same arithmetic on f32 storage: dy rounded to bf16 values,
// x already rounded (saved as bf16, exactly its values). dw goes straight into the
// weight's gradient buffer when it has one (see autograd::leaf_grad_buffer): no
// [N, K] temporary, no pass to add it.
// x: what the forward saved (undefined when dw is not wanted), of shape x_shape.
std::vector<Tensor> linear_backward(const Tensor& dy, const Shape& x_shape, const Tensor& x, bool need_dx,
                                    const Tensor& w, const Tensor& b, bool bf16_values) {
  int64_t n = w.size(0), k = w.size(1);
  const DType compute = w.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  const Tensor dy_c = compute == DType::BF16 ? bf16_copy(dy) : bf16_values ? bf16_valued_copy(dy) : dy;
  Tensor dx, dw, db;
  if (need_dx) dx = Tensor::empty(x_shape);
  Tensor x_c, buffer;  // buffer: the weight's gradient buffer (added into), or dw
  bool accumulate = false;
  if (w.requires_grad()) {
    TP_CHECK(x.defined(), "linear backward: the weight {} asks for a gradient it did not ask for in the forward",
             shape_str(w.shape()));
    // Under bf16 arithmetic x was saved as bf16 (saved_input): a bf16 GEMM reads it as it is, the f32 GEMM of
    // bf16 values reads it widened back (exact).
    x_c = compute == DType::BF16 || x.dtype() == DType::F32 ? x : x.to(DType::F32);
    buffer = autograd::leaf_grad_buffer(w);
    accumulate = buffer.defined();
    if (!accumulate) dw = buffer = Tensor::empty({n, k});
  }
  const LinearKernels& kernels = linear_kernels().on(dy_c, w, x_c, dx, buffer);
  kernels.linear_backward(dy_c, w, x_c, accumulate, dx, buffer);
  if (b.defined() && b.requires_grad()) {
    db = Tensor::zeros({n});
    kernels.bias_grad(dy, db);
  }
  return {dx, dw, db};
}

Tensor f32_bias(const Tensor& b) { return b.defined() ? b.to(DType::F32) : Tensor(); }

// What a linear keeps of its input for dw: under bf16 compute a bf16 copy (half
// the bytes of the f32 input, and all the backward reads of it), else x itself;
// for an input that can be made again (a sequence-parallel block's gathered
// input, autograd::Rebuild) only the way to make it. Siblings that read one input
// (q|k|v, gate|up, a LoRA adapter's A next to its base) share the copy the first
// one made: the last input rounded on this thread is remembered (weakly:
// nothing is kept alive for it).
struct SavedInput {
  Tensor values;
  std::shared_ptr<autograd::Rebuild> rebuild;
  bool round = false;
  Tensor get() const {
    if (!rebuild) return values;
    return round ? rebuild->get_bf16() : rebuild->get();
  }
};

SavedInput saved_input(const Tensor& x, bool round) {
  if (auto rebuild = autograd::rebuild_of(x)) return {Tensor(), rebuild, round};
  if (!round) return {x, nullptr, false};
  struct Last {
    std::weak_ptr<TensorImpl> source;
    std::weak_ptr<Storage> copy;
  };
  thread_local Last last;
  if (auto source = last.source.lock(); source && source.get() == x.impl())
    if (auto copy = last.copy.lock()) return {Tensor::wrap(copy, 0, x.shape(), DType::BF16), nullptr, true};
  Tensor copy = bf16_copy(x);
  last = {x.impl_ptr(), copy.storage()};
  return {copy, nullptr, true};
}

// `bf16_values`: the forward multiplied x rounded to bf16 values (an f32 weight under bf16 compute).
void maybe_record_linear(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, bool bf16_values) {
  if (!autograd::needs_grad({x, w, b})) return;
  const bool need_dx = x.requires_grad();
  // dw needs x; dx alone needs only the weight.
  const SavedInput saved =
      w.requires_grad() ? saved_input(x, bf16_values || w.dtype() == DType::BF16) : SavedInput{};
  const Shape x_shape = x.shape();
  autograd::record("linear", {x, w, b}, {y},
                   [saved, x_shape, need_dx, w, b, bf16_values](const std::vector<Tensor>& g) {
                     return linear_backward(g[0], x_shape, saved.get(), need_dx, w, b, bf16_values);
                   });
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, std::optional<DType> compute) {
  TP_CHECK(w.defined(), "linear: weight must be defined");
  check_linear_args(x, w.shape(), w.dtype(), b);
  const int64_t n = w.size(0);
  TP_CHECK(!compute || *compute == DType::F32 || *compute == DType::BF16,
           "linear: compute dtype must be f32 or bf16, got {}", dtype_name(compute.value_or(DType::F32)));
  TP_CHECK(!compute || *compute == DType::BF16 || w.dtype() == DType::F32,
           "linear: f32 compute needs an f32 weight, got {} (a bf16 weight computes in bf16)", dtype_name(w.dtype()));
  const bool bf16_values = compute == DType::BF16 && w.dtype() == DType::F32;
  Tensor y = autograd::kept_output();  // a selective checkpoint's recompute: the forward's product
  if (!y.defined()) {
    const Tensor x_values = bf16_values ? bf16_valued_copy(x) : x;
    y = Tensor::empty(linear_out_shape(x, n));
    Tensor bias = f32_bias(b);
    // Inference (a router, an unpacked head) where oneDNN's rounding follows the
    // shape: a row's bits must not depend on the batch.
    const bool batch_invariant = detail::ordered_gemm_wanted() && !autograd::needs_grad({x, w, b});
    linear_kernels().on(x_values, w, bias, y).linear(x_values, w, bias, batch_invariant, y);
  }
  autograd::keep_output(y);
  maybe_record_linear(y, x, w, b, bf16_values);
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  TP_CHECK(a.defined() && b.defined(), "matmul: both operands must be defined");
  TP_CHECK(b.dim() == 2, "matmul: b must be 2-D [K, N], got shape {} (a {})", shape_str(b.shape()),
           shape_str(a.shape()));
  TP_CHECK(a.dim() >= 2 && a.size(-1) == b.size(0), "matmul: a shape {} does not match b shape {} (a's last dim must equal b's dim 0)",
           shape_str(a.shape()), shape_str(b.shape()));
  TP_CHECK(a.dtype() == DType::F32, "matmul: a must be f32, got {} (b {})", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  TP_CHECK(b.dtype() == DType::F32 || b.dtype() == DType::BF16, "matmul: b must be f32 or bf16, got {}",
           dtype_name(b.dtype()));
  Tensor y = Tensor::empty(linear_out_shape(a, b.size(1)));
  linear_kernels().on(a, b, y).matmul(a, b, y);
  if (autograd::needs_grad({a, b})) {
    autograd::record("matmul", {a, b}, {y}, [a, b](const std::vector<Tensor>& g) {
      Tensor da = a.requires_grad() ? Tensor::empty(a.shape()) : Tensor();
      Tensor db = b.requires_grad() ? Tensor::empty(b.shape()) : Tensor();
      linear_kernels().on(a, b, g[0]).matmul_backward(a, b, g[0], da, db);
      return std::vector<Tensor>{da, db};
    });
  }
  return y;
}

// ---- PackedLinear

// oneDNN picks the blocked weight layout per primitive; it usually does not
// depend on M, so one packed copy serves every M. When a primitive for some M
// wants another layout, that layout is packed once too and kept.
struct PackedLinear::State {
  struct Variant {
    memory::desc w_md;
    std::shared_ptr<Storage> buffer;  // ours, not oneDNN's: 2 MiB aligned and on huge pages
    memory w_mem;
  };
  struct Prim {
    dnnl::matmul prim;
    memory::desc x_md, y_md, bias_md;
    size_t variant;
  };
  // f32 GEMMs over pair-swapped panels of variants[0] (bf16_pairs.h).
  struct PairedPrim {
    dnnl::matmul prim;
    memory::desc x_md, w_md, y_md, bias_md;
  };
  std::mutex mutex;
  std::vector<Variant> variants;
  std::map<std::pair<int64_t, bool>, Prim> prims;                         // (M, has bias)
  std::map<std::tuple<int64_t, int64_t, bool>, PairedPrim> paired_prims;  // (M, columns, has bias)
  // The packed weight the paired form and the decode kernel read (variants[0], whose
  // layout and buffer never change after construction), when it is a bf16 weight of
  // even K in bf16_pairs.h's panel layout; null otherwise. Set once, read without the lock.
  const bf16* panels = nullptr;
  memory::desc panels_md;
  // K rows per chunk of the decode kernel (bf16_gemv.h); 0: keep oneDNN; -1: not probed
  // yet. gemv_rows: the most rows it takes for this weight (set before gemv_chunk).
  std::atomic<int64_t> gemv_chunk{-1}, gemv_rows{0};

  memory::data_type dt() const;
  Tensor weight;  // undefined once released
  int64_t n = 0, k = 0;
  DType dtype = DType::F32;  // the packed copy's: f32 for a bf16 weight where oneDNN has no bf16 matmul
  // Products run ordered_gemm (ordered_gemm.h) straight from `weight`, which is kept
  // (not packed): where oneDNN's matmul would round by shape.
  bool ordered = false;

  size_t variant_for(const memory::desc& md) {
    for (size_t i = 0; i < variants.size(); ++i)
      if (variants[i].w_md == md) return i;
    // Huge pages: packing writes every page once (10 us per 4 KiB fault here) and
    // decode streams the whole matrix per token (fewer TLB misses).
    auto buffer = Storage::allocate_exact(md.get_size());
    Variant v{md, buffer, memory(md, detail::dnnl_engine(), buffer->data())};
    pack(v);
    variants.push_back(std::move(v));
    return variants.size() - 1;
  }

  void pack(Variant& v) {
    memory src;
    if (weight.defined()) {
      // The user weight [N, K] row-major is the [K, N] matrix with strides {1, K};
      // a bf16 weight without bf16 matmuls is packed widened (State::dtype f32).
      const Tensor w = weight.dtype() == dtype ? weight : weight.to(dtype);
      src = memory(memory::desc({k, n}, dt(), memory::format_tag::ba), detail::dnnl_engine(), w.raw_data());
    } else {
      src = variants.front().w_mem;  // original released: convert between packed layouts
    }
    dnnl::reorder(src, v.w_mem).execute(detail::dnnl_stream(), src, v.w_mem);
    detail::dnnl_stream().wait();
  }

  const Prim& prim_for(int64_t m, bool has_bias) {
    auto key = std::make_pair(m, has_bias);
    auto it = prims.find(key);
    if (it != prims.end()) return it->second;
    memory::desc x_md({m, k}, dt(), memory::format_tag::ab);
    memory::desc w_any({k, n}, dt(), memory::format_tag::any);
    memory::desc bias_md =
        has_bias ? memory::desc({1, n}, memory::data_type::f32, memory::format_tag::ab) : memory::desc();
    memory::desc y_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_md, w_any, bias_md, y_md), detail::dnnl_engine());
    size_t v = variant_for(pd.weights_desc());
    return prims.emplace(key, Prim{dnnl::matmul(pd), x_md, y_md, bias_md, v}).first->second;
  }

  const PairedPrim& paired_prim_for(int64_t m, int64_t cols, bool has_bias) {
    auto key = std::make_tuple(m, cols, has_bias);
    auto it = paired_prims.find(key);
    if (it != paired_prims.end()) return it->second;
    memory::desc x_md({m, k}, memory::data_type::f32, memory::format_tag::ab);
    memory::desc w_md({k, cols}, memory::data_type::f32, memory::format_tag::BA16a64b);
    memory::desc bias_md =
        has_bias ? memory::desc({1, cols}, memory::data_type::f32, memory::format_tag::ab) : memory::desc();
    memory::desc y_md({m, cols}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_md, w_md, bias_md, y_md), detail::dnnl_engine());
    return paired_prims.emplace(key, PairedPrim{dnnl::matmul(pd), x_md, w_md, y_md, bias_md}).first->second;
  }
};

memory::data_type PackedLinear::State::dt() const {
  return dtype == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

PackedLinear::PackedLinear(const Tensor& w, bool keep_weight) {
  TP_CHECK(w.defined() && w.dim() == 2, "PackedLinear: weight must be 2-D [out, in], got shape {}",
           w.defined() ? shape_str(w.shape()) : std::string("(undefined)"));
  TP_CHECK(w.dtype() == DType::F32 || w.dtype() == DType::BF16, "PackedLinear: weight must be f32 or bf16, got {}",
           dtype_name(w.dtype()));
  shape_ = w.shape();
  dtype_ = w.dtype();
  prefers_f32_gemms_ = dtype_ == DType::BF16 && !detail::bf16_gemm_native();
  state_ = std::make_shared<State>();
  state_->weight = w;
  state_->n = w.size(0);
  state_->k = w.size(1);
  state_->ordered = detail::ordered_gemm_wanted();
  state_->dtype = w.dtype() == DType::BF16 && !detail::bf16_matmul_available() && !state_->ordered ? DType::F32
                                                                                                     : w.dtype();
  if (w.numel() > 0 && !state_->ordered) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->prim_for(1, false);  // packs now, so the first forward pays nothing
    const State::Variant& v = state_->variants.front();
    if (state_->dtype == DType::BF16 && state_->k % 2 == 0 && detail::is_bf16_panel_layout(v.w_md)) {
      state_->panels = static_cast<const bf16*>(v.buffer->data());
      state_->panels_md = v.w_md;
    }
  }
  if (keep_weight) {
    weight_ = w;
  } else if (!state_->ordered) {
    state_->weight = Tensor();
  }
}

size_t PackedLinear::packed_copies() const {
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->ordered ? 1 : state_->variants.size();
}

void PackedLinear::repack() {
  if (!state_) return;
  TP_CHECK(weight_.defined(), "PackedLinear::repack: the original weight {} was released (keep_weight = false)",
           shape_str(shape_));
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& v : state_->variants) state_->pack(v);  // none when ordered: it reads the weight itself
}

namespace {

using detail::Bf16Kernel;
using detail::Bf16Path;

// y [m, n] = src [m, k] (bf16 for a bf16 weight, else f32) · w (+ bias) through oneDNN's packed primitive.
void onednn_linear_into(float* y, const void* src, PackedLinear::State& s, int64_t m, const float* bias) {
  dnnl::matmul prim;
  memory::desc x_md, y_md, bias_md;
  memory w_mem;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    const PackedLinear::State::Prim& p = s.prim_for(m, bias != nullptr);
    prim = p.prim;
    x_md = p.x_md;
    y_md = p.y_md;
    bias_md = p.bias_md;
    w_mem = s.variants[p.variant].w_mem;
  }
  auto& engine = detail::dnnl_engine();
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(x_md, engine, const_cast<void*>(src))},
                                       {DNNL_ARG_WEIGHTS, w_mem},
                                       {DNNL_ARG_DST, memory(y_md, engine, y)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(bias_md, engine, const_cast<float*>(bias)));
  prim.execute(detail::dnnl_stream(), args);
  detail::dnnl_stream().wait();
}

// How the kernel of bf16_gemv.h runs a weight: the chunk (0: not at all, keep oneDNN)
// and the most rows it takes.
struct GemvPlan {
  int64_t chunk = 0, max_rows = 0;
};

// The kernel's plan for this weight: the first chunk whose one-row results, with and
// without a bias, are oneDNN's bits on a probe row, and then kBf16GemvMaxRows rows if
// the kernel's products over 3 and over kBf16GemvMaxRows rows are also oneDNN's bits
// for those rows (so a row's bits do not depend on how many decode beside it), else 1.
// Probed once per weight shape (oneDNN picks its K blocking from the shape), on the
// first weight of that shape.
GemvPlan probe_gemv_plan(PackedLinear::State& s) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, int64_t>, GemvPlan> by_shape;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = by_shape.find({s.k, s.n});
    if (it != by_shape.end()) return it->second;
  }
  const int64_t rows = detail::kBf16GemvMaxRows;
  Tensor x = Tensor::randn({rows, s.k}, 11).to(DType::BF16), b = Tensor::randn({s.n}, 12);
  std::vector<float> want(static_cast<size_t>(rows * s.n)), got(want.size());
  auto same = [&](int64_t m) { return std::memcmp(want.data(), got.data(), m * s.n * sizeof(float)) == 0; };
  auto agrees = [&](int64_t m, int64_t chunk) {
    for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data<float>())}) {
      onednn_linear_into(want.data(), x.raw_data(), s, m, bias);
      detail::bf16_panel_gemv(x.data<bf16>(), m, s.panels, s.panels_md, chunk, bias, got.data());
      if (!same(m)) return false;
    }
    return true;
  };
  GemvPlan plan;
  for (int64_t c : {s.k, int64_t{512}, int64_t{1024}, int64_t{256}, int64_t{2048}, int64_t{128}, int64_t{4096}}) {
    if (c > s.k || c % 2 != 0 || !agrees(1, c)) continue;
    plan = {c, agrees(3, c) && agrees(rows, c) ? rows : 1};
    break;
  }
  std::lock_guard<std::mutex> lock(mutex);
  by_shape[{s.k, s.n}] = plan;
  return plan;
}

// The chunk with which a product of m rows runs the kernel of bf16_gemv.h (probed on
// first use), or 0 when it keeps oneDNN.
int64_t gemv_chunk_for(PackedLinear::State& s, Bf16Path path, int64_t m) {
  if (m > detail::kBf16GemvMaxRows || path == Bf16Path::Native || s.panels == nullptr ||
      !detail::bf16_gemv_available() || detail::bf16_gemm_forced_native())
    return 0;
  int64_t chunk = s.gemv_chunk.load(std::memory_order_acquire);
  if (chunk < 0) {
    const GemvPlan plan = probe_gemv_plan(s);
    s.gemv_rows.store(plan.max_rows, std::memory_order_relaxed);
    s.gemv_chunk.store(chunk = plan.chunk, std::memory_order_release);
  }
  return m <= s.gemv_rows.load(std::memory_order_relaxed) ? chunk : 0;
}

// Rows from which the paired form pays for cutting its panels (each call converts
// the whole weight once): measured on a Xeon without AMX, [M x 1024] x [1024 x 3072]
// ran 1.1x native at M = 64, 1.3x at 128, 1.5-1.7x at 512, slower below 48.
constexpr int64_t kPairedMinRows = 64;
// f32 panels converted per GEMM call: about 1.5 MiB, so they stay in L2.
constexpr int64_t kPairedChunkBytes = 3 << 19;

// out = x · w^T (+ bias) as f32 GEMMs over pair-swapped panels (bf16_pairs.h).
void paired_linear_into(const Tensor& out, const Tensor& x, PackedLinear::State& s, const Tensor& bias, int64_t m) {
  const int64_t n = s.n, k = s.k, rows = detail::paired_k_rows(k);
  const int64_t panels = (n + detail::kPanelColumns - 1) / detail::kPanelColumns;
  const int64_t group =
      std::max<int64_t>(1, kPairedChunkBytes / (rows * detail::kPanelColumns * static_cast<int64_t>(sizeof(float))));
  const bool whole = group >= panels;
  float* xs = detail::paired_scratch(0, static_cast<size_t>(m * k));
  float* panel_buf =
      detail::paired_scratch(1, static_cast<size_t>(std::min(group, panels) * rows * detail::kPanelColumns));
  float* cols_buf = whole ? nullptr : detail::paired_scratch(2, static_cast<size_t>(m * group * detail::kPanelColumns));
  detail::pair_swapped_rows(x.raw_data(), x.dtype(), m, k, xs);
  auto& engine = detail::dnnl_engine();
  float* y = out.data<float>();
  for (int64_t p0 = 0; p0 < panels; p0 += group) {
    const int64_t count = std::min(group, panels - p0), n0 = p0 * detail::kPanelColumns;
    const int64_t cols = std::min(n - n0, count * detail::kPanelColumns);
    detail::pair_swapped_panels(s.panels, s.panels_md, p0, count, panel_buf);
    PackedLinear::State::PairedPrim p;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      p = s.paired_prim_for(m, cols, bias.defined());
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(p.x_md, engine, xs)},
                                         {DNNL_ARG_WEIGHTS, memory(p.w_md, engine, panel_buf)},
                                         {DNNL_ARG_DST, memory(p.y_md, engine, whole ? y : cols_buf)}};
    if (bias.defined()) args.emplace(DNNL_ARG_BIAS, memory(p.bias_md, engine, bias.data<float>() + n0));
    p.prim.execute(detail::dnnl_stream(), args);
    detail::dnnl_stream().wait();
    if (!whole) {
      parallel_for(m, m * cols > 65536, [&](int64_t i) {
        std::memcpy(y + i * n + n0, cols_buf + i * cols, static_cast<size_t>(cols) * sizeof(float));
      });
    }
  }
}

// Whether the paired form gives the native GEMM's bits on this machine: one probe
// product per process, both ways, compared bit for bit (odd K, a bias, a tail panel).
bool paired_f32_exact() {
  static const bool exact = [] {
    const int64_t m = kPairedMinRows, k = 330, n = 200;
    PackedLinear w(Tensor::randn({n, k}, 7).to(DType::BF16), /*keep_weight=*/false);
    Tensor x = Tensor::randn({m, k}, 8), b = Tensor::randn({n}, 9);
    Tensor native = Tensor::empty({m, n}), paired = Tensor::empty({m, n});
    detail::linear_into_path(native, x, w, b, Bf16Path::Native);
    if (detail::linear_into_path(paired, x, w, b, Bf16Path::Paired) != Bf16Kernel::Paired) return false;
    return std::memcmp(native.raw_data(), paired.raw_data(), static_cast<size_t>(m * n) * sizeof(float)) == 0;
  }();
  return exact;
}

bool paired_applies(const PackedLinear::State& s, bool prefers_f32_gemms, int64_t m, Bf16Path path) {
  if (path == Bf16Path::Native || s.panels == nullptr) return false;
  if (path == Bf16Path::Paired) return true;
  return m >= kPairedMinRows && prefers_f32_gemms && paired_f32_exact();
}

// The packed weight's product: batch-invariant (ordered), the paired f32 form,
// the decode kernel, or oneDNN's packed primitive, as linear.h describes.
Bf16Kernel packed_linear_cpu(const PackedLinear& w, PackedLinear::State& s, const Tensor& x, const Tensor& bias,
                             Bf16Path path, const Tensor& out) {
  const int64_t m = rows_of(x), n = w.out_features(), k = w.in_features();
  if (k == 0) {
    std::memset(out.raw_data(), 0, out.nbytes());
    if (bias.defined()) {
      for (int64_t i = 0; i < m; ++i)
        std::copy(bias.data<float>(), bias.data<float>() + n, out.data<float>() + i * n);
    }
    return Bf16Kernel::OneDnn;
  }
  if (s.ordered) {
    detail::ordered_gemm(m, n, k, x.raw_data(), x.dtype(), k, s.weight.raw_data(), s.dtype, k,
                         bias.defined() ? bias.data<float>() : nullptr, out.data<float>(), n);
    return Bf16Kernel::Ordered;
  }
  if (paired_applies(s, w.prefers_f32_gemms(), m, path)) {
    paired_linear_into(out, x, s, bias, m);
    return Bf16Kernel::Paired;
  }
  const void* src = x.raw_data();
  const size_t x_n = static_cast<size_t>(m * k);
  if (w.dtype() == DType::BF16 && s.dtype == DType::F32) {
    // A weight packed widened (no bf16 matmul here): x as bf16 values in f32, in the
    // paired form's row buffer (that form never runs on a widened weight).
    float* buf = detail::paired_scratch(0, x_n);
    if (x.dtype() == DType::BF16)
      detail::to_f32_parallel(x.data<bf16>(), buf, x_n);
    else
      detail::round_to_bf16_parallel(x.data<float>(), buf, x_n);
    src = buf;
  } else if (w.dtype() == DType::BF16 && x.dtype() == DType::F32) {
    bf16* buf = detail::bf16_scratch(x_n);
    detail::to_bf16_parallel(x.data<float>(), buf, x_n);
    src = buf;
  }
  const float* bias_ptr = bias.defined() ? bias.data<float>() : nullptr;
  if (const int64_t chunk = gemv_chunk_for(s, path, m); chunk > 0) {
    detail::bf16_panel_gemv(static_cast<const bf16*>(src), m, s.panels, s.panels_md, chunk, bias_ptr,
                            out.data<float>());
    return Bf16Kernel::Gemv;
  }
  onednn_linear_into(out.data<float>(), src, s, m, bias_ptr);
  return Bf16Kernel::OneDnn;
}

constexpr LinearKernels kCpuLinearKernels{linear_cpu, linear_backward_cpu, bias_grad_cpu, matmul_cpu,
                                          matmul_backward_cpu, packed_linear_cpu};

}  // namespace

KernelTable<LinearKernels>& linear_kernels() {
  static KernelTable<LinearKernels> table("linear", &kCpuLinearKernels);
  return table;
}

bool detail::bf16_paired_f32_exact() { return paired_f32_exact(); }

int detail::bf16_decode_prefetch_choice() { return detail::bf16_gemv_prefetch_choice(); }

void linear_into(Tensor& out, const Tensor& x, const PackedLinear& w, const Tensor& b) {
  detail::linear_into_path(out, x, w, b, Bf16Path::Auto);
}

detail::Bf16Kernel detail::linear_into_path(Tensor& out, const Tensor& x, const PackedLinear& w, const Tensor& b,
                                            Bf16Path path) {
  TP_CHECK(w.defined(), "linear_into: the PackedLinear is empty (default-constructed)");
  int64_t m = check_linear_args(x, w.shape_, w.dtype_, b, /*bf16_x_ok=*/true);
  const int64_t n = w.out_features();
  Shape want = linear_out_shape(x, n);
  TP_CHECK(out.defined() && out.shape() == want && out.dtype() == DType::F32,
           "linear_into: out must be f32 of shape {} for input {} and weight {}, got {} {}", shape_str(want),
           shape_str(x.shape()), shape_str(w.shape_), out.defined() ? dtype_name(out.dtype()) : "undefined",
           out.defined() ? shape_str(out.shape()) : "");
  if (m == 0 || n == 0) return Bf16Kernel::OneDnn;
  const Tensor bias = f32_bias(b);
  return linear_kernels().on(x, bias, out).packed_linear(w, *w.state_, x, bias, path, out);
}

PackedLinear pack_stacked(const std::vector<Tensor>& weights) {
  TP_CHECK(!weights.empty(), "pack_stacked: no weights given");
  const Tensor& first = weights[0];
  int64_t rows = 0;
  for (const Tensor& w : weights) {
    TP_CHECK(w.dim() == 2 && w.dtype() == first.dtype() && w.size(1) == first.size(1),
             "pack_stacked: weights must be [rows, {}] {}, got {} {}", first.size(1), dtype_name(first.dtype()),
             shape_str(w.shape()), dtype_name(w.dtype()));
    rows += w.size(0);
  }
  const size_t bytes = static_cast<size_t>(rows * first.size(1)) * dtype_size(first.dtype());
  std::shared_ptr<void> buffer(std::malloc(bytes), std::free);
  TP_CHECK(buffer != nullptr, "pack_stacked: cannot allocate {} bytes to stack {} weights", bytes, weights.size());
  Tensor stacked = Tensor::wrap(Storage::wrap(buffer.get(), bytes, buffer), 0, {rows, first.size(1)}, first.dtype());
  char* at = static_cast<char*>(stacked.raw_data());
  for (const Tensor& w : weights) {
    std::memcpy(at, w.raw_data(), w.nbytes());
    at += w.nbytes();
  }
  return PackedLinear(stacked, /*keep_weight=*/false);
}

Tensor linear(const Tensor& x, const PackedLinear& w, const Tensor& b) {
  TP_CHECK(w.defined(), "linear: the PackedLinear is empty (default-constructed)");
  TP_CHECK(w.weight().defined() || !autograd::needs_grad({x, b}),
           "linear: a gradient was requested through a PackedLinear {} whose original weight was released "
           "(keep_weight = false); keep it, or run under NoGradGuard",
           shape_str(Shape{w.out_features(), w.in_features()}));
  TP_CHECK(x.dtype() != DType::BF16 || !autograd::needs_grad({w.weight(), b}),
           "linear: a bf16 input {} is for inference; gradients through weight {} need an f32 input",
           shape_str(x.shape()), shape_str(Shape{w.out_features(), w.in_features()}));
  Tensor y = Tensor::empty(linear_out_shape(x, w.out_features()));
  linear_into(y, x, w, b);
  maybe_record_linear(y, x, w.weight(), b, false);
  return y;
}

}  // namespace tp::ops
