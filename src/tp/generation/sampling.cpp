#include "tp/generation/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "tp/core/error.h"
#include "tp/tensor/random.h"

namespace tp::generation {

int64_t select_token(const float* logits, int64_t vocab, const SamplingOptions& o, int64_t row, int64_t step) {
  TP_CHECK(vocab > 0, "cannot pick a token from an empty vocabulary");
  TP_CHECK(o.temperature >= 0, "temperature must be >= 0, got {}", o.temperature);
  TP_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p must be in (0, 1], got {}", o.top_p);
  TP_CHECK(o.top_k >= 0, "top_k must be >= 0, got {}", o.top_k);
  if (o.temperature == 0) return std::max_element(logits, logits + vocab) - logits;

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
  double u = uniform01(mix64(o.seed) ^ static_cast<uint64_t>(row), static_cast<uint64_t>(step)) * kept_total;
  for (size_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u < 0) return ids[i];
  }
  return ids[keep - 1];
}

std::vector<int64_t> vocab_parallel_argmax(const float* logits, int64_t batch, int64_t n, int64_t vocab_start,
                                           dist::ProcessGroup& group, int64_t* rank0_flag) {
  // Per row: the logit's bits and its id (-1: this rank holds none of the row); then the flag.
  const int64_t width = 2 * batch + 1;
  Tensor mine = Tensor::zeros({width}, DType::I64);
  int64_t* m = mine.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = logits + b * n;
    int64_t best = -1;
    if (group.rank() == 0) {
      // The row's first element starts std::max_element's scan; a NaN there stays the answer.
      if (n > 0) best = std::max_element(row, row + n) - row;
    } else {
      // Later pieces meet a running maximum that is a number (else rank 0's NaN wins):
      // a NaN never replaces it, so this piece's candidate is its first largest number.
      for (int64_t j = 0; j < n; ++j)
        if (!std::isnan(row[j]) && (best < 0 || row[best] < row[j])) best = j;
    }
    m[2 * b] = best < 0 ? 0 : std::bit_cast<int32_t>(row[best]);
    m[2 * b + 1] = best < 0 ? -1 : vocab_start + best;
  }
  m[2 * batch] = rank0_flag != nullptr && group.rank() == 0 ? *rank0_flag : 0;
  const Tensor all = group.all_gather(mine, 0);
  const int64_t* a = all.data<int64_t>();
  std::vector<int64_t> tokens(static_cast<size_t>(batch), -1);
  for (int64_t b = 0; b < batch; ++b) {
    float top = 0;
    for (int r = 0; r < group.size(); ++r) {
      const int64_t id = a[r * width + 2 * b + 1];
      const float v = std::bit_cast<float>(static_cast<int32_t>(a[r * width + 2 * b]));
      // Strictly larger, as std::max_element: a tie keeps the earlier rank's (lower) id.
      if (id >= 0 && (tokens[b] < 0 || top < v)) {
        top = v;
        tokens[b] = id;
      }
    }
    TP_CHECK(tokens[b] >= 0, "vocab_parallel_argmax: no rank holds any logit of row {}", b);
  }
  if (rank0_flag != nullptr) *rank0_flag = a[2 * batch];
  return tokens;
}

}  // namespace tp::generation
