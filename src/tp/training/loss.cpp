#include "tp/training/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tp/autograd/tape.h"
#include "tp/ops/gemm.h"
#include "tp/ops/vec.h"
#include "tp/tensor/convert.h"

namespace tp::training {

namespace {

// Row r = b * T + t predicts labels[b, t + 1]; the last position of each sequence predicts nothing.
std::vector<int64_t> shifted_targets(const Tensor& labels, int64_t ignore_index) {
  const int64_t B = labels.size(0), T = labels.size(1);
  std::vector<int64_t> l = labels.to_int_vector(), out(static_cast<size_t>(B * T), ignore_index);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) out[b * T + t] = l[b * T + t + 1];
  return out;
}

void check_labels(const Tensor& labels, const char* what) {
  TP_CHECK(labels.defined() && labels.dim() == 2 && (labels.dtype() == DType::I64 || labels.dtype() == DType::I32),
           "{}: labels must be an i64 tensor [batch, tokens], got {} {}", what,
           labels.defined() ? dtype_name(labels.dtype()) : "undefined",
           labels.defined() ? shape_str(labels.shape()) : "");
}

// The shifted targets, each inside the vocabulary or the ignore index.
std::vector<int64_t> checked_targets(const Tensor& labels, const VocabSlice& vocab, int64_t ignore_index) {
  const std::vector<int64_t> target = shifted_targets(labels, ignore_index);
  for (size_t r = 0; r < target.size(); ++r)
    TP_CHECK(target[r] == ignore_index || (target[r] >= 0 && target[r] < vocab.vocab_size),
             "label {} (batch row {}, position {}) is outside the vocabulary [0, {}) and is not the ignore index {}",
             target[r], r / labels.size(1), r % labels.size(1) + 1, vocab.vocab_size, ignore_index);
  return target;
}

double mean_loss(const std::vector<int64_t>& target, const float* mx, const float* sum_exp, const float* target_logit,
                 double normalizer, int64_t ignore_index) {
  double total = 0;
  for (size_t r = 0; r < target.size(); ++r)
    if (target[r] != ignore_index) total += std::log(static_cast<double>(sum_exp[r])) + mx[r] - target_logit[r];
  return total / normalizer;
}

// Row max, then [sum of e^(x - max) | target logit] of `rows` rows of logits x [rows, v]
// (this rank's vocabulary from `start`), reduced over the vocab group.
void softmax_stats(const float* x, int64_t rows, int64_t v, const int64_t* target, int64_t start,
                   int64_t ignore_index, dist::ProcessGroup* group, float* mx, float* sum_exp, float* target_logit) {
  const auto& vk = ops::detail::vec_kernels();
  Tensor row_max = Tensor::empty({rows});
  float* m = row_max.data<float>();
#pragma omp parallel for schedule(static) if (rows * v > 65536)
  for (int64_t r = 0; r < rows; ++r) m[r] = vk.max(x + r * v, v);
  if (group != nullptr) group->all_reduce(row_max, dist::ReduceOp::Max);
  Tensor sums = Tensor::zeros({2, rows});
  float* se = sums.data<float>();
  float* tl = se + rows;
#pragma omp parallel for schedule(static) if (rows * v > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    se[r] = vk.exp_sum(x + r * v, v, m[r]);
    const int64_t local = target[r] - start;
    if (target[r] != ignore_index && local >= 0 && local < v) tl[r] = x[r * v + local];
  }
  if (group != nullptr) group->all_reduce(sums, dist::ReduceOp::Sum);
  std::copy(m, m + rows, mx);
  std::copy(se, se + rows, sum_exp);
  std::copy(tl, tl + rows, target_logit);
}

// d[r, j] = k * (softmax[r, j] - [j == target[r]]) over logits x [rows, v], in place.
void softmax_grad_in_place(float* x, int64_t rows, int64_t v, const int64_t* target, int64_t start,
                           int64_t ignore_index, const float* mx, const float* sum_exp, float k) {
  const auto& vk = ops::detail::vec_kernels();
#pragma omp parallel for schedule(static) if (rows * v > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    float* dr = x + r * v;
    if (target[r] == ignore_index) {
      std::fill(dr, dr + v, 0.f);
      continue;
    }
    vk.exp_scale(dr, v, mx[r], k / sum_exp[r], dr);
    const int64_t local = target[r] - start;
    if (local >= 0 && local < v) dr[local] -= k;
  }
}

}  // namespace

int64_t count_targets(const Tensor& labels, int64_t ignore_index) {
  check_labels(labels, "count_targets");
  int64_t n = 0;
  for (int64_t t : shifted_targets(labels, ignore_index)) n += t != ignore_index;
  return n;
}

Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels, double normalizer, const VocabSlice& vocab,
                      int64_t ignore_index) {
  check_labels(labels, "causal_lm_loss");
  TP_CHECK(logits.defined() && logits.dtype() == DType::F32 && logits.dim() == 3 &&
               logits.size(0) == labels.size(0) && logits.size(1) == labels.size(1),
           "causal_lm_loss: logits must be f32 [batch, tokens, vocab] matching labels {}, got {} {}",
           shape_str(labels.shape()), dtype_name(logits.dtype()), shape_str(logits.shape()));
  TP_CHECK(normalizer > 0, "causal_lm_loss: the normalizer (targets in the step) must be positive, got {}",
           normalizer);
  const int64_t rows = logits.size(0) * logits.size(1), v = logits.size(2);
  const std::vector<int64_t> target = checked_targets(labels, vocab, ignore_index);
  dist::ProcessGroup* group = vocab.group != nullptr && vocab.group->size() > 1 ? vocab.group : nullptr;
  Tensor stats = Tensor::empty({3, rows});  // row max | sum of exponentials | target logit
  float* mx = stats.data<float>();
  softmax_stats(logits.data<float>(), rows, v, target.data(), vocab.start, ignore_index, group, mx, mx + rows,
                mx + 2 * rows);
  Tensor loss = Tensor::full({}, mean_loss(target, mx, mx + rows, mx + 2 * rows, normalizer, ignore_index));

  if (autograd::needs_grad({logits})) {
    const int64_t start = vocab.start;
    autograd::record("causal_lm_loss", {logits, labels}, {loss},
                     [logits, target, stats, normalizer, start, ignore_index](const std::vector<Tensor>& g) {
                       const int64_t rows = logits.size(0) * logits.size(1), v = logits.size(2);
                       const float k = static_cast<float>(g[0].item() / normalizer);
                       const float* mx = stats.data<float>();
                       Tensor dx = logits.clone();
                       softmax_grad_in_place(dx.data<float>(), rows, v, target.data(), start, ignore_index, mx,
                                             mx + rows, k);
                       return std::vector<Tensor>{dx, Tensor()};
                     });
  }
  return loss;
}

namespace {

// How lm_head multiplies (ops::linear's arithmetic): in f32, with a bf16 weight
// (bf16 operands), or an f32 weight holding bf16 values with the input rounded
// to bf16 values (bf16 arithmetic run as f32 GEMMs).
struct HeadMath {
  DType w_dtype = DType::F32;
  bool bf16_values = false;
  bool bf16() const { return w_dtype == DType::BF16 || bf16_values; }
};

// Rows [r0, r0 + n) of the saved input as the forward GEMM's A operand: the saved
// bf16 copy as it is (a bf16 weight) or widened (exactly its rounded values), or
// the f32 input itself. `widened` is the scratch [n, H] f32 buffer.
const void* input_rows(const Tensor& saved, const HeadMath& math, int64_t r0, int64_t n, int64_t h, float* widened,
                       DType* a_dtype) {
  if (!math.bf16()) {
    *a_dtype = DType::F32;
    return saved.data<float>() + r0 * h;
  }
  const bf16* rows = saved.data<bf16>() + r0 * h;
  if (math.w_dtype == DType::BF16) {
    *a_dtype = DType::BF16;
    return rows;
  }
  convert_bf16_to_f32(rows, widened, static_cast<size_t>(n * h));
  *a_dtype = DType::F32;
  return widened;
}

// softmax_stats over every row of `saved` (lm_head's input) with w held by rows:
// a block of w's rows at a time, each row's running max and sum of exponentials
// rescaled when a block raises the max (the online softmax), then combined over
// the vocab group (to rounding: the sums of exponentials are rescaled). One block
// is softmax_stats' own arithmetic. `logits` holds [chunk, block] products of w's v rows.
void softmax_stats_by_rows(autograd::LeafByRows& by_rows, const Tensor& saved, const HeadMath& math,
                           const std::vector<int64_t>& target, int64_t start, int64_t ignore_index,
                           dist::ProcessGroup* group, int64_t v, int64_t v_max, int64_t chunk, Tensor& logits,
                           Tensor& widened, Tensor& stats) {
  const auto& vk = ops::detail::vec_kernels();
  const int64_t rows = stats.size(1), h = saved.size(-1), step = std::max<int64_t>(by_rows.block_rows(), 1);
  float* mx = stats.data<float>();
  float* se = mx + rows;
  float* tl = se + rows;
  auto block_logits = [&](const void* wb, int64_t nb, int64_t r0, int64_t n) {
    DType a_dtype;
    const void* a = input_rows(saved, math, r0, n, h, widened.defined() ? widened.data<float>() : nullptr, &a_dtype);
    ops::detail::gemm({n, nb, h, false, true, a_dtype, math.w_dtype}, a, wb, nullptr, logits.data<float>());
  };
  if (v_max <= step) {
    // One block (on every rank of the vocab group: their collectives differ):
    // softmax_stats itself, bit for bit the loss of the whole matrix.
    const Tensor w_block = by_rows.weight_rows(0, v);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      block_logits(w_block.raw_data(), v, r0, n);
      softmax_stats(logits.data<float>(), n, v, target.data() + r0, start, ignore_index, group, mx + r0, se + r0,
                    tl + r0);
    }
    return;
  }
  std::fill(mx, mx + rows, -std::numeric_limits<float>::infinity());
  std::fill(se, se + 2 * rows, 0.f);
  for (int64_t b0 = 0; b0 < v; b0 += step) {
    const int64_t nb = std::min(step, v - b0);
    const Tensor w_block = by_rows.weight_rows(b0, nb);  // alive while the block is used
    const void* wb = w_block.raw_data();
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      block_logits(wb, nb, r0, n);
      const float* x = logits.data<float>();
#pragma omp parallel for schedule(static) if (n * nb > 65536)
      for (int64_t r = 0; r < n; ++r) {
        const int64_t R = r0 + r;
        const float m = vk.max(x + r * nb, nb);
        if (m > mx[R]) {
          se[R] *= std::exp(mx[R] - m);
          mx[R] = m;
        }
        se[R] += vk.exp_sum(x + r * nb, nb, mx[R]);
        const int64_t local = target[R] - start - b0;
        if (target[R] != ignore_index && local >= 0 && local < nb) tl[R] = x[r * nb + local];
      }
    }
  }
  if (group == nullptr) return;
  Tensor global_max = stats.narrow(0, 0, 1).clone();
  group->all_reduce(global_max, dist::ReduceOp::Max);
  const float* gm = global_max.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    se[r] = se[r] == 0.f ? 0.f : se[r] * std::exp(mx[r] - gm[r]);
    mx[r] = gm[r];
  }
  Tensor sums = stats.narrow(0, 1, 2);
  group->all_reduce(sums, dist::ReduceOp::Sum);
}

// dy as linear's backward rounds it: bf16 for a bf16 weight (into `d_bf16`), bf16
// values for bf16 arithmetic on f32 (in place); the GEMM operand.
const void* round_like_linear(float* d, int64_t n, const HeadMath& math, DType compute, Tensor& d_bf16) {
  if (compute == DType::BF16) {
    ops::detail::to_bf16_parallel(d, d_bf16.data<bf16>(), static_cast<size_t>(n));
    return d_bf16.data<bf16>();
  }
  if (math.bf16_values) ops::detail::round_to_bf16_parallel(d, d, static_cast<size_t>(n));
  return d;
}

}  // namespace

Tensor causal_lm_loss_from_hidden(const Tensor& hidden, const Tensor& w, std::optional<DType> compute,
                                  const Tensor& labels, double normalizer, const VocabSlice& vocab,
                                  int64_t ignore_index, int64_t chunk_bytes) {
  check_labels(labels, "causal_lm_loss_from_hidden");
  TP_CHECK(hidden.defined() && hidden.dtype() == DType::F32 && hidden.dim() == 3 &&
               hidden.size(0) == labels.size(0) && hidden.size(1) == labels.size(1),
           "causal_lm_loss_from_hidden: hidden must be f32 [batch, tokens, hidden] matching labels {}, got {} {}",
           shape_str(labels.shape()), hidden.defined() ? dtype_name(hidden.dtype()) : "undefined",
           hidden.defined() ? shape_str(hidden.shape()) : "");
  TP_CHECK(w.defined() && w.dim() == 2 && w.size(1) == hidden.size(2) &&
               (w.dtype() == DType::F32 || w.dtype() == DType::BF16),
           "causal_lm_loss_from_hidden: lm_head's weight must be f32 or bf16 [vocab, {}], got {} {}", hidden.size(2),
           w.defined() ? dtype_name(w.dtype()) : "undefined", w.defined() ? shape_str(w.shape()) : "");
  TP_CHECK(normalizer > 0, "causal_lm_loss_from_hidden: the normalizer (targets in the step) must be positive, got {}",
           normalizer);
  TP_CHECK(chunk_bytes > 0, "causal_lm_loss_from_hidden: chunk_bytes must be positive, got {}", chunk_bytes);
  const std::vector<int64_t> target = checked_targets(labels, vocab, ignore_index);
  const HeadMath math{w.dtype(), compute == DType::BF16 && w.dtype() == DType::F32};
  const int64_t rows = hidden.size(0) * hidden.size(1), h = hidden.size(2), v = w.size(0);
  dist::ProcessGroup* group = vocab.group != nullptr && vocab.group->size() > 1 ? vocab.group : nullptr;
  // Chunks from the largest slice of the vocabulary: every rank runs as many (each has collectives).
  const int64_t v_max = group != nullptr ? chunk_span(vocab.vocab_size, group->size(), 0).size : v;
  const int64_t chunk = std::clamp<int64_t>(chunk_bytes / (4 * std::max<int64_t>(v_max, 1)), 1, std::max<int64_t>(rows, 1));
  // The backward reads only the rounded values of a bf16 product's input: half the bytes.
  Tensor saved = hidden;
  if (math.bf16()) {
    saved = Tensor::empty(hidden.shape(), DType::BF16);
    ops::detail::to_bf16_parallel(hidden.data<float>(), saved.data<bf16>(), static_cast<size_t>(rows * h));
  }
  Tensor logits = Tensor::empty({chunk, v});
  Tensor widened = math.bf16_values ? Tensor::empty({chunk, h}) : Tensor();
  auto chunk_logits = [&](const Tensor& in, int64_t r0, int64_t n) {
    DType a_dtype;
    const void* a = input_rows(in, math, r0, n, h, widened.defined() ? widened.data<float>() : nullptr, &a_dtype);
    ops::detail::gemm({n, v, h, false, true, a_dtype, w.dtype()}, a, w.raw_data(), nullptr, logits.data<float>());
  };
  Tensor stats = Tensor::empty({3, rows});  // row max | sum of exponentials | target logit
  float* mx = stats.data<float>();
  if (autograd::LeafByRows* by_rows = autograd::leaf_by_rows(w)) {
    softmax_stats_by_rows(*by_rows, saved, math, target, vocab.start, ignore_index, group, v, v_max, chunk, logits,
                          widened, stats);
  } else {
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      chunk_logits(saved, r0, n);
      softmax_stats(logits.data<float>(), n, v, target.data() + r0, vocab.start, ignore_index, group, mx + r0,
                    mx + rows + r0, mx + 2 * rows + r0);
    }
  }
  Tensor loss = Tensor::full({}, mean_loss(target, mx, mx + rows, mx + 2 * rows, normalizer, ignore_index));
  if (!autograd::needs_grad({hidden, w})) return loss;

  const bool need_dh = hidden.requires_grad();
  const Shape hidden_shape = hidden.shape();
  const int64_t start = vocab.start;
  autograd::record(
      "causal_lm_loss_from_hidden", {hidden, w}, {loss},
      [saved, w, math, target, stats, normalizer, start, ignore_index, chunk, rows, h, v, need_dh,
       hidden_shape](const std::vector<Tensor>& g) {
        const float k = static_cast<float>(g[0].item() / normalizer);
        const float* mx = stats.data<float>();
        Tensor logits = Tensor::empty({chunk, v});
        Tensor widened = math.bf16_values ? Tensor::empty({chunk, h}) : Tensor();
        Tensor d_bf16 = math.w_dtype == DType::BF16 ? Tensor::empty({chunk, v}, DType::BF16) : Tensor();
        const DType compute = math.w_dtype == DType::BF16 ? DType::BF16 : DType::F32;
        if (autograd::LeafByRows* by_rows = autograd::leaf_by_rows(w)) {
          // w held by rows (FSDP's root): block by block of w's rows, each block's
          // logits again for every chunk of tokens and its dw whole before the
          // next block; dh sums the blocks' products.
          Tensor dh = need_dh ? Tensor::zeros({rows, h}) : Tensor();
          const int64_t step = std::max<int64_t>(by_rows->block_rows(), 1);
          for (int64_t b0 = 0; b0 < v; b0 += step) {
            const int64_t nb = std::min(step, v - b0);
            const Tensor w_block = by_rows->weight_rows(b0, nb);  // alive while the block is used
            const void* wb = w_block.raw_data();
            Tensor dwb = by_rows->begin_grad_block(b0, nb);
            for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
              const int64_t n = std::min(chunk, rows - r0);
              DType a_dtype;
              const void* a = input_rows(saved, math, r0, n, h, widened.defined() ? widened.data<float>() : nullptr,
                                         &a_dtype);
              ops::detail::gemm({n, nb, h, false, true, a_dtype, w.dtype()}, a, wb, nullptr, logits.data<float>());
              float* d = logits.data<float>();
              softmax_grad_in_place(d, n, nb, target.data() + r0, start + b0, ignore_index, mx + r0, mx + rows + r0,
                                    k);
              const void* dy = round_like_linear(d, n * nb, math, compute, d_bf16);
              if (need_dh) {
                ops::detail::GemmSpec spec{n, h, nb, false, false, compute, w.dtype()};
                spec.accumulate = true;
                ops::detail::gemm(spec, dy, wb, nullptr, dh.data<float>() + r0 * h);
              }
              ops::detail::GemmSpec spec{nb, h, n, true, false, compute, a_dtype};
              spec.accumulate = true;
              ops::detail::gemm(spec, dy, a, nullptr, dwb.data<float>());
            }
            by_rows->end_grad_block();
          }
          return std::vector<Tensor>{need_dh ? dh.reshape(hidden_shape) : Tensor(), Tensor()};
        }
        Tensor dh = need_dh ? Tensor::empty({rows, h}) : Tensor();
        Tensor dw;
        Tensor buffer = w.requires_grad() ? autograd::leaf_grad_buffer(w) : Tensor();
        if (w.requires_grad() && !buffer.defined()) buffer = dw = Tensor::zeros(w.shape());
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
          const int64_t n = std::min(chunk, rows - r0);
          DType a_dtype;
          const void* a = input_rows(saved, math, r0, n, h, widened.defined() ? widened.data<float>() : nullptr,
                                     &a_dtype);
          ops::detail::gemm({n, v, h, false, true, a_dtype, w.dtype()}, a, w.raw_data(), nullptr,
                            logits.data<float>());
          float* d = logits.data<float>();
          softmax_grad_in_place(d, n, v, target.data() + r0, start, ignore_index, mx + r0, mx + rows + r0, k);
          const void* dy = round_like_linear(d, n * v, math, compute, d_bf16);
          if (need_dh)
            ops::detail::gemm({n, h, v, false, false, compute, w.dtype()}, dy, w.raw_data(), nullptr,
                              dh.data<float>() + r0 * h);
          if (buffer.defined()) {
            ops::detail::GemmSpec spec{v, h, n, true, false, compute, a_dtype};
            spec.accumulate = true;
            ops::detail::gemm(spec, dy, a, nullptr, buffer.data<float>());
          }
        }
        return std::vector<Tensor>{need_dh ? dh.reshape(hidden_shape) : Tensor(), dw};
      });
  return loss;
}

}  // namespace tp::training
