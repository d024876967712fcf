#include "tp/ops/vocab_parallel_loss.h"

#include <algorithm>
#include <cmath>

#include "tp/core/parallel_for.h"
#include "tp/ops/detail/vocab_parallel_loss_kernels.h"
#include "tp/ops/gemm.h"
#include "tp/ops/util.h"
#include "tp/ops/vec.h"
#include "tp/tensor/convert.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

void row_max_cpu(const Tensor& logits, const Tensor& row_max) {
  const auto& vk = detail::vec_kernels();
  const int64_t rows = logits.size(0), v = logits.size(1);
  const float* x = logits.data<float>();
  float* m = row_max.data<float>();
  parallel_for(rows, rows * v > 65536, [&](int64_t r) { m[r] = vk.max(x + r * v, v); });
}

void exp_sums_cpu(const Tensor& logits, const Tensor& row_max, const Tensor& target_t, int64_t start,
                  int64_t ignore_index, const Tensor& sums) {
  const auto& vk = detail::vec_kernels();
  const int64_t rows = logits.size(0), v = logits.size(1);
  const float* x = logits.data<float>();
  const float* m = row_max.data<float>();
  const int64_t* target = target_t.data<int64_t>();
  float* se = sums.data<float>();
  float* tl = se + rows;
  parallel_for(rows, rows * v > 65536, [&](int64_t r) {
    se[r] = vk.exp_sum(x + r * v, v, m[r]);
    const int64_t local = target[r] - start;
    if (target[r] != ignore_index && local >= 0 && local < v) tl[r] = x[r * v + local];
  });
}

void online_stats_cpu(const Tensor& logits, const Tensor& target_t, int64_t start, int64_t ignore_index,
                      const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit) {
  const auto& vk = detail::vec_kernels();
  const int64_t n = logits.size(0), nb = logits.size(1);
  const float* x = logits.data<float>();
  const int64_t* target = target_t.data<int64_t>();
  float* mx = row_max.data<float>();
  float* se = sum_exp.data<float>();
  float* tl = target_logit.data<float>();
  parallel_for(n, n * nb > 65536, [&](int64_t r) {
    const float m = vk.max(x + r * nb, nb);
    if (m > mx[r]) {
      se[r] *= std::exp(mx[r] - m);
      mx[r] = m;
    }
    se[r] += vk.exp_sum(x + r * nb, nb, mx[r]);
    const int64_t local = target[r] - start;
    if (target[r] != ignore_index && local >= 0 && local < nb) tl[r] = x[r * nb + local];
  });
}

void rescale_to_max_cpu(const Tensor& global_max, const Tensor& row_max, const Tensor& sum_exp) {
  const int64_t rows = row_max.numel();
  const float* gm = global_max.data<float>();
  float* mx = row_max.data<float>();
  float* se = sum_exp.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    se[r] = se[r] == 0.f ? 0.f : se[r] * std::exp(mx[r] - gm[r]);
    mx[r] = gm[r];
  }
}

double total_cpu(const Tensor& target_t, int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp_t,
                 const Tensor& target_logit_t) {
  const int64_t rows = target_t.numel();
  const int64_t* target = target_t.data<int64_t>();
  const float* mx = row_max.data<float>();
  const float* sum_exp = sum_exp_t.data<float>();
  const float* target_logit = target_logit_t.data<float>();
  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (target[r] != ignore_index) total += std::log(static_cast<double>(sum_exp[r])) + mx[r] - target_logit[r];
  return total;
}

void softmax_grad_cpu(const Tensor& logits, const Tensor& target_t, int64_t start, int64_t ignore_index,
                      const Tensor& row_max, const Tensor& sum_exp, float k) {
  const auto& vk = detail::vec_kernels();
  const int64_t rows = logits.size(0), v = logits.size(1);
  float* x = logits.data<float>();
  const int64_t* target = target_t.data<int64_t>();
  const float* mx = row_max.data<float>();
  const float* se = sum_exp.data<float>();
  parallel_for(rows, rows * v > 65536, [&](int64_t r) {
    float* dr = x + r * v;
    if (target[r] == ignore_index) {
      std::fill(dr, dr + v, 0.f);
      return;
    }
    vk.exp_scale(dr, v, mx[r], k / se[r], dr);
    const int64_t local = target[r] - start;
    if (local >= 0 && local < v) dr[local] -= k;
  });
}

void to_bf16_cpu(const Tensor& hidden, const Tensor& out) {
  detail::to_bf16_parallel(hidden.data<float>(), out.data<bf16>(), static_cast<size_t>(hidden.numel()));
}

// The saved rows as the forward GEMM's A operand: the bf16 copy as it is (a bf16
// weight) or widened into `widened` (exactly its rounded values), or the f32 input itself.
const void* input_rows(const Tensor& saved_rows, const LmHeadMath& math, const Tensor& widened, DType* a_dtype) {
  if (!math.bf16()) {
    *a_dtype = DType::F32;
    return saved_rows.data<float>();
  }
  const bf16* rows = saved_rows.data<bf16>();
  if (math.w_dtype == DType::BF16) {
    *a_dtype = DType::BF16;
    return rows;
  }
  convert_bf16_to_f32(rows, widened.data<float>(), static_cast<size_t>(saved_rows.numel()));
  *a_dtype = DType::F32;
  return widened.data<float>();
}

// logits = A · w_rowsᵀ, A the saved rows as input_rows gives them (returned).
const void* head_product(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                         const Tensor& widened, const Tensor& logits, DType* a_dtype) {
  const int64_t n = saved_rows.size(0), h = saved_rows.size(1), nb = w_rows.size(0);
  const void* a = input_rows(saved_rows, math, widened, a_dtype);
  detail::gemm({n, nb, h, false, true, *a_dtype, math.w_dtype}, a, w_rows.raw_data(), nullptr, logits.data<float>());
  return a;
}

void chunk_logits_cpu(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math, const Tensor& widened,
                      const Tensor& logits) {
  DType a_dtype;
  head_product(saved_rows, w_rows, math, widened, logits, &a_dtype);
}

// dy as linear's backward rounds it: bf16 for a bf16 weight (into `d_bf16`), bf16
// values for bf16 arithmetic on f32 (in place); the GEMM operand.
const void* round_like_linear(float* d, int64_t n, const LmHeadMath& math, DType compute, const Tensor& d_bf16) {
  if (compute == DType::BF16) {
    detail::to_bf16_parallel(d, d_bf16.data<bf16>(), static_cast<size_t>(n));
    return d_bf16.data<bf16>();
  }
  if (math.bf16_values) detail::round_to_bf16_parallel(d, d, static_cast<size_t>(n));
  return d;
}

void chunk_backward_cpu(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math, const Tensor& target,
                        int64_t start, int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp, float k,
                        const Tensor& logits, const Tensor& widened, const Tensor& d_bf16, const Tensor& dh_rows,
                        bool accumulate_dh, const Tensor& dw) {
  const int64_t n = saved_rows.size(0), h = saved_rows.size(1), nb = w_rows.size(0);
  const DType compute = math.w_dtype == DType::BF16 ? DType::BF16 : DType::F32;
  DType a_dtype;
  const void* a = head_product(saved_rows, w_rows, math, widened, logits, &a_dtype);
  softmax_grad_cpu(logits, target, start, ignore_index, row_max, sum_exp, k);
  const void* dy = round_like_linear(logits.data<float>(), n * nb, math, compute, d_bf16);
  if (dh_rows.defined()) {
    detail::GemmSpec spec{n, h, nb, false, false, compute, math.w_dtype};
    spec.accumulate = accumulate_dh;
    detail::gemm(spec, dy, w_rows.raw_data(), nullptr, dh_rows.data<float>());
  }
  if (dw.defined()) {
    detail::GemmSpec spec{nb, h, n, true, false, compute, a_dtype};
    spec.accumulate = true;
    detail::gemm(spec, dy, a, nullptr, dw.data<float>());
  }
}

constexpr VocabParallelLossKernels kCpuVocabParallelLossKernels{
    row_max_cpu,  exp_sums_cpu,     online_stats_cpu, rescale_to_max_cpu, total_cpu, softmax_grad_cpu,
    to_bf16_cpu, chunk_logits_cpu, chunk_backward_cpu};

// ---- argument checks

void check_logits(const Tensor& logits, const Tensor& target, const char* op) {
  check_f32(logits, op, "logits");
  TP_CHECK(logits.dim() == 2 && target.defined() && target.dtype() == DType::I64 && target.dim() == 1 &&
               target.size(0) == logits.size(0),
           "{}: logits must be [n, v] with i64 targets [n], got {} and {} {}", op, shape_str(logits.shape()),
           target.defined() ? dtype_name(target.dtype()) : "undefined",
           target.defined() ? shape_str(target.shape()) : "");
}

void check_stat(const Tensor& stat, int64_t rows, const char* op, const char* name) {
  check_f32(stat, op, name);
  TP_CHECK(stat.numel() == rows, "{}: {} must hold {} values, got shape {}", op, name, rows, shape_str(stat.shape()));
}

// The rows' part [n, nb] of a chunk's logits buffer (a view).
Tensor logits_view(const LmHeadScratch& scratch, int64_t n, int64_t nb, const char* op) {
  TP_CHECK(scratch.logits.defined() && scratch.logits.numel() >= n * nb,
           "{}: the scratch logits hold {} values, {} x {} are needed", op,
           scratch.logits.defined() ? scratch.logits.numel() : 0, n, nb);
  return scratch.logits.flatten().narrow(0, 0, n * nb).reshape({n, nb});
}

void check_head_operands(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                         const LmHeadScratch& scratch, const char* op) {
  const DType saved_dtype = math.bf16() ? DType::BF16 : DType::F32;
  TP_CHECK(saved_rows.defined() && saved_rows.dim() == 2 && saved_rows.dtype() == saved_dtype,
           "{}: the saved input must be {} [n, H]", op, dtype_name(saved_dtype));
  TP_CHECK(w_rows.defined() && w_rows.dim() == 2 && w_rows.size(1) == saved_rows.size(1) &&
               w_rows.dtype() == math.w_dtype,
           "{}: lm_head's rows must be {} [nb, {}], got {} {}", op, dtype_name(math.w_dtype), saved_rows.size(1),
           w_rows.defined() ? dtype_name(w_rows.dtype()) : "undefined",
           w_rows.defined() ? shape_str(w_rows.shape()) : "");
  TP_CHECK(!math.bf16_values || (scratch.widened.defined() && scratch.widened.numel() >= saved_rows.numel()),
           "{}: bf16 values on an f32 weight need a widened scratch of {} values", op, saved_rows.numel());
}

}  // namespace

KernelTable<VocabParallelLossKernels>& vocab_parallel_loss_kernels() {
  static KernelTable<VocabParallelLossKernels> table("vocab_parallel_loss", &kCpuVocabParallelLossKernels);
  return table;
}

void loss_row_max(const Tensor& logits, const Tensor& row_max) {
  check_f32(logits, "loss_row_max", "logits");
  TP_CHECK(logits.dim() == 2, "loss_row_max: logits must be [n, v], got {}", shape_str(logits.shape()));
  check_stat(row_max, logits.size(0), "loss_row_max", "row_max");
  vocab_parallel_loss_kernels().on(logits, row_max).row_max(logits, row_max);
}

void loss_exp_sums(const Tensor& logits, const Tensor& row_max, const Tensor& target, int64_t start,
                   int64_t ignore_index, const Tensor& sums) {
  check_logits(logits, target, "loss_exp_sums");
  check_stat(row_max, logits.size(0), "loss_exp_sums", "row_max");
  check_stat(sums, 2 * logits.size(0), "loss_exp_sums", "sums");
  vocab_parallel_loss_kernels().on(logits, row_max, target, sums).exp_sums(logits, row_max, target, start,
                                                                          ignore_index, sums);
}

void loss_online_stats(const Tensor& logits, const Tensor& target, int64_t start, int64_t ignore_index,
                       const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit) {
  check_logits(logits, target, "loss_online_stats");
  for (const Tensor* s : {&row_max, &sum_exp, &target_logit})
    check_stat(*s, logits.size(0), "loss_online_stats", "a statistic");
  vocab_parallel_loss_kernels()
      .on(logits, target, row_max, sum_exp, target_logit)
      .online_stats(logits, target, start, ignore_index, row_max, sum_exp, target_logit);
}

void loss_rescale_to_max(const Tensor& global_max, const Tensor& row_max, const Tensor& sum_exp) {
  check_stat(row_max, global_max.numel(), "loss_rescale_to_max", "row_max");
  check_stat(sum_exp, global_max.numel(), "loss_rescale_to_max", "sum_exp");
  check_f32(global_max, "loss_rescale_to_max", "global_max");
  vocab_parallel_loss_kernels().on(global_max, row_max, sum_exp).rescale_to_max(global_max, row_max, sum_exp);
}

double loss_total(const Tensor& target, int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp,
                  const Tensor& target_logit) {
  TP_CHECK(target.defined() && target.dtype() == DType::I64, "loss_total: targets must be i64");
  for (const Tensor* s : {&row_max, &sum_exp, &target_logit})
    check_stat(*s, target.numel(), "loss_total", "a statistic");
  return vocab_parallel_loss_kernels()
      .on(target, row_max, sum_exp, target_logit)
      .total(target, ignore_index, row_max, sum_exp, target_logit);
}

void loss_softmax_grad_(const Tensor& logits, const Tensor& target, int64_t start, int64_t ignore_index,
                        const Tensor& row_max, const Tensor& sum_exp, float k) {
  check_logits(logits, target, "loss_softmax_grad_");
  check_stat(row_max, logits.size(0), "loss_softmax_grad_", "row_max");
  check_stat(sum_exp, logits.size(0), "loss_softmax_grad_", "sum_exp");
  vocab_parallel_loss_kernels()
      .on(logits, target, row_max, sum_exp)
      .softmax_grad(logits, target, start, ignore_index, row_max, sum_exp, k);
}

Tensor lm_head_saved_input(const Tensor& hidden, const LmHeadMath& math) {
  check_f32(hidden, "lm_head_saved_input", "hidden");
  if (!math.bf16()) return hidden;
  Tensor saved = Tensor::empty(hidden.shape(), DType::BF16);
  vocab_parallel_loss_kernels().on(hidden, saved).to_bf16(hidden, saved);
  return saved;
}

LmHeadScratch lm_head_scratch(const LmHeadMath& math, int64_t chunk, int64_t v, int64_t h, bool backward) {
  return {Tensor::empty({chunk, v}), math.bf16_values ? Tensor::empty({chunk, h}) : Tensor(),
          backward && math.w_dtype == DType::BF16 ? Tensor::empty({chunk, v}, DType::BF16) : Tensor()};
}

Tensor lm_head_chunk_logits(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                            const LmHeadScratch& scratch) {
  check_head_operands(saved_rows, w_rows, math, scratch, "lm_head_chunk_logits");
  Tensor logits = logits_view(scratch, saved_rows.size(0), w_rows.size(0), "lm_head_chunk_logits");
  vocab_parallel_loss_kernels()
      .on(saved_rows, w_rows, logits, scratch.widened)
      .chunk_logits(saved_rows, w_rows, math, scratch.widened, logits);
  return logits;
}

void lm_head_chunk_backward(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                            const Tensor& target, int64_t start, int64_t ignore_index, const Tensor& row_max,
                            const Tensor& sum_exp, float k, const LmHeadScratch& scratch, const Tensor& dh_rows,
                            bool accumulate_dh, const Tensor& dw) {
  const char* op = "lm_head_chunk_backward";
  check_head_operands(saved_rows, w_rows, math, scratch, op);
  const int64_t n = saved_rows.size(0), nb = w_rows.size(0);
  Tensor logits = logits_view(scratch, n, nb, op);
  check_logits(logits, target, op);
  check_stat(row_max, n, op, "row_max");
  check_stat(sum_exp, n, op, "sum_exp");
  TP_CHECK(math.w_dtype != DType::BF16 || (scratch.d_bf16.defined() && scratch.d_bf16.numel() >= n * nb),
           "{}: a bf16 weight needs a bf16 scratch of {} values", op, n * nb);
  TP_CHECK(!dh_rows.defined() || (dh_rows.dtype() == DType::F32 && dh_rows.numel() == saved_rows.numel()),
           "{}: dh must be f32 [{}, {}]", op, n, saved_rows.size(1));
  TP_CHECK(!dw.defined() || (dw.dtype() == DType::F32 && dw.numel() == w_rows.numel()), "{}: dw must be f32 [{}, {}]",
           op, nb, w_rows.size(1));
  vocab_parallel_loss_kernels()
      .on(saved_rows, w_rows, target, row_max, sum_exp, logits, dh_rows, dw)
      .chunk_backward(saved_rows, w_rows, math, target, start, ignore_index, row_max, sum_exp, k, logits,
                      scratch.widened, scratch.d_bf16, dh_rows, accumulate_dh, dw);
}

}  // namespace tp::ops
