#include "tp/generation/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tp/tensor/error.h"
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

}  // namespace tp::generation
