#include "tp/ops/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "tp/core/error.h"
#include "tp/ops/detail/sampling_kernels.h"
#include "tp/ops/vec.h"
#include "tp/tensor/random.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

// std::max_element's answer over row[0..n) (-1 for n = 0), vectorized: the first largest logit, where a NaN is never
// larger but a NaN in row[0], which starts max_element's scan, stays the answer.
int64_t greedy_token(const float* row, int64_t n) {
  if (n > 0 && std::isnan(row[0])) return 0;
  return detail::vec_kernels().argmax(row, n);
}

// The token of one row of logits [vocab] (sample_tokens' rule).
int64_t select_token(const float* logits, int64_t vocab, const SamplingOptions& o, int64_t stream, int64_t step) {
  if (o.temperature == 0) return greedy_token(logits, vocab);

  // Candidates by decreasing logit (stable: equal logits keep id order).
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  auto by_logit = [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
  ids.resize(static_cast<size_t>(k));

  std::vector<double> p(ids.size());
  double max_logit = logits[ids[0]] / o.temperature, total = 0;
  for (size_t i = 0; i < ids.size(); ++i) total += p[i] = std::exp(logits[ids[i]] / o.temperature - max_logit);
  // Nucleus: the smallest prefix whose probability reaches top_p (at least one token).
  size_t keep = ids.size();
  if (o.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += p[i] / total;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  double u = uniform01(mix64(o.seed) ^ static_cast<uint64_t>(stream), static_cast<uint64_t>(step)) * kept_total;
  for (size_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u < 0) return ids[i];
  }
  return ids[keep - 1];
}

void sample_cpu(const Tensor& logits, const SamplingOptions& o, const std::vector<int64_t>& streams,
                const std::vector<int64_t>& steps, const Tensor& ids) {
  const int64_t B = logits.size(0), V = logits.size(1);
  const float* l = logits.data<float>();
  int64_t* out = ids.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) out[b] = select_token(l + b * V, V, o, streams[b], steps[b]);
}

void argmax_candidates_cpu(const Tensor& logits, int64_t vocab_start, bool first_piece, const Tensor& out) {
  const int64_t B = logits.size(0), n = logits.size(1);
  int64_t* m = out.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const float* row = logits.data<float>() + b * n;
    // Only the first piece may answer a NaN (its row[0], as max_element would over the whole row); the others
    // offer their largest number, else nothing.
    const int64_t best = first_piece ? greedy_token(row, n) : detail::vec_kernels().argmax(row, n);
    m[2 * b] = best < 0 ? 0 : std::bit_cast<int32_t>(row[best]);
    m[2 * b + 1] = best < 0 ? -1 : vocab_start + best;
  }
}

void best_candidates_cpu(const Tensor& candidates, const Tensor& ids) {
  const int64_t pieces = candidates.size(0), B = candidates.size(1);
  const int64_t* a = candidates.data<int64_t>();
  int64_t* token = ids.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    float top = 0;
    token[b] = -1;
    for (int64_t r = 0; r < pieces; ++r) {
      const int64_t id = a[(r * B + b) * 2 + 1];
      const float v = std::bit_cast<float>(static_cast<int32_t>(a[(r * B + b) * 2]));
      // Strictly larger, as std::max_element: a tie keeps the earlier piece's (lower) id.
      if (id >= 0 && (token[b] < 0 || top < v)) {
        top = v;
        token[b] = id;
      }
    }
    TP_CHECK(token[b] >= 0, "best_candidates: no piece holds any logit of row {}", b);
  }
}

constexpr SamplingKernels kCpuSamplingKernels{sample_cpu, argmax_candidates_cpu, best_candidates_cpu};

void check_logits(const Tensor& logits, const char* op) {
  TP_CHECK(logits.dim() == 2 && logits.dtype() == DType::F32, "{}: logits must be f32 [rows, vocab], got {} {}", op,
           dtype_name(logits.dtype()), shape_str(logits.shape()));
}

}  // namespace

KernelTable<SamplingKernels>& sampling_kernels() {
  static KernelTable<SamplingKernels> table("sampling", &kCpuSamplingKernels);
  return table;
}

Tensor sample_tokens(const Tensor& logits, const SamplingOptions& o, const std::vector<int64_t>& streams,
                     const std::vector<int64_t>& steps) {
  check_logits(logits, "sample_tokens");
  const int64_t B = logits.size(0), V = logits.size(1);
  TP_CHECK(V > 0, "cannot pick a token from an empty vocabulary");
  TP_CHECK(o.temperature >= 0, "temperature must be >= 0, got {}", o.temperature);
  TP_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p must be in (0, 1], got {}", o.top_p);
  TP_CHECK(o.top_k >= 0, "top_k must be >= 0, got {}", o.top_k);
  TP_CHECK(static_cast<int64_t>(streams.size()) == B && static_cast<int64_t>(steps.size()) == B,
           "sample_tokens: {} streams and {} steps for {} rows", streams.size(), steps.size(), B);
  Tensor ids = Tensor::empty({B}, DType::I64);
  sampling_kernels().on(logits).sample(logits, o, streams, steps, ids);
  return ids;
}

Tensor argmax_candidates(const Tensor& logits, int64_t vocab_start, bool first_piece) {
  check_logits(logits, "argmax_candidates");
  Tensor out = Tensor::empty({logits.size(0), 2}, DType::I64);
  sampling_kernels().on(logits).argmax_candidates(logits, vocab_start, first_piece, out);
  return out;
}

Tensor best_candidates(const Tensor& candidates) {
  TP_CHECK(candidates.dim() == 3 && candidates.size(2) == 2 && candidates.dtype() == DType::I64,
           "best_candidates: candidates must be i64 [pieces, rows, 2], got {} {}", dtype_name(candidates.dtype()),
           shape_str(candidates.shape()));
  Tensor ids = Tensor::empty({candidates.size(1)}, DType::I64);
  sampling_kernels().on(candidates).best_candidates(candidates, ids);
  return ids;
}

}  // namespace tp::ops
