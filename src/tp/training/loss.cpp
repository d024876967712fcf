#include "tp/training/loss.h"

#include <algorithm>
#include <limits>

#include "tp/autograd/tape.h"
#include "tp/ops/vocab_parallel_loss.h"

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

// The shifted targets [B * T] i64, each inside the vocabulary or the ignore index.
Tensor checked_targets(const Tensor& labels, const VocabSlice& vocab, int64_t ignore_index) {
  const std::vector<int64_t> target = shifted_targets(labels, ignore_index);
  for (size_t r = 0; r < target.size(); ++r)
    TP_CHECK(target[r] == ignore_index || (target[r] >= 0 && target[r] < vocab.vocab_size),
             "label {} (batch row {}, position {}) is outside the vocabulary [0, {}) and is not the ignore index {}",
             target[r], r / labels.size(1), r % labels.size(1) + 1, vocab.vocab_size, ignore_index);
  return Tensor::from_ints(target, {static_cast<int64_t>(target.size())});
}

// The rows' statistics: [rows] views of stats [3, rows] (row max | sum of
// exponentials | target logit).
struct Stats {
  Tensor max, sum_exp, target_logit;

  static Stats of(const Tensor& stats) { return {stats.select(0, 0), stats.select(0, 1), stats.select(0, 2)}; }
  Stats rows(int64_t r0, int64_t n) const {
    return {max.narrow(0, r0, n), sum_exp.narrow(0, r0, n), target_logit.narrow(0, r0, n)};
  }
};

double mean_loss(const Tensor& target, const Stats& stats, double normalizer, int64_t ignore_index) {
  return ops::loss_total(target, ignore_index, stats.max, stats.sum_exp, stats.target_logit) / normalizer;
}

// Row max, then [sum of e^(x - max) | target logit] of logits [rows, v] (this
// rank's vocabulary from `start`), reduced over the vocab group, into `out`.
void softmax_stats(const Tensor& logits, const Tensor& target, int64_t start, int64_t ignore_index,
                   dist::ProcessGroup* group, Stats out) {
  const int64_t rows = logits.size(0);
  Tensor row_max = Tensor::empty({rows});
  ops::loss_row_max(logits, row_max);
  if (group != nullptr) group->all_reduce(row_max, dist::ReduceOp::Max);
  Tensor sums = Tensor::zeros({2, rows});
  ops::loss_exp_sums(logits, row_max, target, start, ignore_index, sums);
  if (group != nullptr) group->all_reduce(sums, dist::ReduceOp::Sum);
  out.max.copy_from(row_max);
  out.sum_exp.copy_from(sums.select(0, 0));
  out.target_logit.copy_from(sums.select(0, 1));
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
  const Tensor target = checked_targets(labels, vocab, ignore_index);
  dist::ProcessGroup* group = vocab.group != nullptr && vocab.group->size() > 1 ? vocab.group : nullptr;
  Tensor stats = Tensor::empty({3, rows});  // row max | sum of exponentials | target logit
  softmax_stats(logits.reshape({rows, v}), target, vocab.start, ignore_index, group, Stats::of(stats));
  Tensor loss = Tensor::full({}, mean_loss(target, Stats::of(stats), normalizer, ignore_index));

  if (autograd::needs_grad({logits})) {
    const int64_t start = vocab.start;
    autograd::record("causal_lm_loss", {logits, labels}, {loss},
                     [logits, target, stats, normalizer, start, ignore_index](const std::vector<Tensor>& g) {
                       const float k = static_cast<float>(g[0].item() / normalizer);
                       const Stats s = Stats::of(stats);
                       Tensor dx = logits.clone();
                       ops::loss_softmax_grad_(dx.reshape({target.numel(), logits.size(2)}), target, start,
                                               ignore_index, s.max, s.sum_exp, k);
                       return std::vector<Tensor>{dx, Tensor()};
                     });
  }
  return loss;
}

namespace {

// softmax_stats over every row of `saved` (lm_head's input, [rows, H]) with w held
// by rows: a block of w's rows at a time, each row's running max and sum of
// exponentials rescaled when a block raises the max (the online softmax), then
// combined over the vocab group (to rounding: the sums of exponentials are
// rescaled). One block is softmax_stats' own arithmetic.
void softmax_stats_by_rows(autograd::LeafByRows& by_rows, const Tensor& saved, const ops::LmHeadMath& math,
                           const ops::LmHeadScratch& scratch, const Tensor& target, int64_t start,
                           int64_t ignore_index, dist::ProcessGroup* group, int64_t v, int64_t v_max, int64_t chunk,
                           const Tensor& stats) {
  const int64_t rows = stats.size(1), step = std::max<int64_t>(by_rows.block_rows(), 1);
  Stats all = Stats::of(stats);
  if (v_max <= step) {
    // One block (on every rank of the vocab group: their collectives differ):
    // softmax_stats itself, bit for bit the loss of the whole matrix.
    const Tensor w_block = by_rows.weight_rows(0, v);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      const Tensor logits = ops::lm_head_chunk_logits(saved.narrow(0, r0, n), w_block, math, scratch);
      softmax_stats(logits, target.narrow(0, r0, n), start, ignore_index, group, all.rows(r0, n));
    }
    return;
  }
  all.max.fill(-std::numeric_limits<float>::infinity());
  stats.narrow(0, 1, 2).zero();
  for (int64_t b0 = 0; b0 < v; b0 += step) {
    const int64_t nb = std::min(step, v - b0);
    const Tensor w_block = by_rows.weight_rows(b0, nb);  // alive while the block is used
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      const Tensor logits = ops::lm_head_chunk_logits(saved.narrow(0, r0, n), w_block, math, scratch);
      const Stats s = all.rows(r0, n);
      ops::loss_online_stats(logits, target.narrow(0, r0, n), start + b0, ignore_index, s.max, s.sum_exp,
                             s.target_logit);
    }
  }
  if (group == nullptr) return;
  Tensor global_max = all.max.clone();
  group->all_reduce(global_max, dist::ReduceOp::Max);
  ops::loss_rescale_to_max(global_max, all.max, all.sum_exp);
  Tensor sums = stats.narrow(0, 1, 2);
  group->all_reduce(sums, dist::ReduceOp::Sum);
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
  const Tensor target = checked_targets(labels, vocab, ignore_index);
  const ops::LmHeadMath math{w.dtype(), compute == DType::BF16 && w.dtype() == DType::F32};
  const int64_t rows = hidden.size(0) * hidden.size(1), h = hidden.size(2), v = w.size(0);
  dist::ProcessGroup* group = vocab.group != nullptr && vocab.group->size() > 1 ? vocab.group : nullptr;
  // Chunks from the largest slice of the vocabulary: every rank runs as many (each has collectives).
  const int64_t v_max = group != nullptr ? chunk_span(vocab.vocab_size, group->size(), 0).size : v;
  const int64_t chunk =
      std::clamp<int64_t>(chunk_bytes / (4 * std::max<int64_t>(v_max, 1)), 1, std::max<int64_t>(rows, 1));
  // The backward reads only the rounded values of a bf16 product's input: half the bytes.
  const Tensor saved = ops::lm_head_saved_input(hidden, math).reshape({rows, h});
  const ops::LmHeadScratch scratch = ops::lm_head_scratch(math, chunk, v, h, false);
  Tensor stats = Tensor::empty({3, rows});  // row max | sum of exponentials | target logit
  if (autograd::LeafByRows* by_rows = autograd::leaf_by_rows(w)) {
    softmax_stats_by_rows(*by_rows, saved, math, scratch, target, vocab.start, ignore_index, group, v, v_max, chunk,
                          stats);
  } else {
    const Stats all = Stats::of(stats);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      const Tensor logits = ops::lm_head_chunk_logits(saved.narrow(0, r0, n), w, math, scratch);
      softmax_stats(logits, target.narrow(0, r0, n), vocab.start, ignore_index, group, all.rows(r0, n));
    }
  }
  Tensor loss = Tensor::full({}, mean_loss(target, Stats::of(stats), normalizer, ignore_index));
  if (!autograd::needs_grad({hidden, w})) return loss;

  const bool need_dh = hidden.requires_grad();
  const Shape hidden_shape = hidden.shape();
  const int64_t start = vocab.start;
  autograd::record(
      "causal_lm_loss_from_hidden", {hidden, w}, {loss},
      [saved, w, math, target, stats, normalizer, start, ignore_index, chunk, rows, h, v, need_dh,
       hidden_shape](const std::vector<Tensor>& g) {
        const float k = static_cast<float>(g[0].item() / normalizer);
        const Stats all = Stats::of(stats);
        const ops::LmHeadScratch scratch = ops::lm_head_scratch(math, chunk, v, h, true);
        if (autograd::LeafByRows* by_rows = autograd::leaf_by_rows(w)) {
          // w held by rows (FSDP's root): block by block of w's rows, each block's
          // logits again for every chunk of tokens and its dw whole before the
          // next block; dh sums the blocks' products.
          Tensor dh = need_dh ? Tensor::zeros({rows, h}) : Tensor();
          const int64_t step = std::max<int64_t>(by_rows->block_rows(), 1);
          for (int64_t b0 = 0; b0 < v; b0 += step) {
            const int64_t nb = std::min(step, v - b0);
            const Tensor w_block = by_rows->weight_rows(b0, nb);  // alive while the block is used
            Tensor dwb = by_rows->begin_grad_block(b0, nb);
            for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
              const int64_t n = std::min(chunk, rows - r0);
              const Stats s = all.rows(r0, n);
              ops::lm_head_chunk_backward(saved.narrow(0, r0, n), w_block, math, target.narrow(0, r0, n),
                                          start + b0, ignore_index, s.max, s.sum_exp, k, scratch,
                                          need_dh ? dh.narrow(0, r0, n) : Tensor(), true, dwb);
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
          const Stats s = all.rows(r0, n);
          ops::lm_head_chunk_backward(saved.narrow(0, r0, n), w, math, target.narrow(0, r0, n), start, ignore_index,
                                      s.max, s.sum_exp, k, scratch, need_dh ? dh.narrow(0, r0, n) : Tensor(), false,
                                      buffer);
        }
        return std::vector<Tensor>{need_dh ? dh.reshape(hidden_shape) : Tensor(), dw};
      });
  return loss;
}

}  // namespace tp::training
