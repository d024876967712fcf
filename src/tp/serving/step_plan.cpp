#include "tp/serving/step_plan.h"

#include "tp/core/error.h"

namespace tp::serving {

std::vector<int64_t> StepPlan::encode() const {
  std::vector<int64_t> w{stop ? 1 : 0, static_cast<int64_t>(resets.size())};
  w.insert(w.end(), resets.begin(), resets.end());
  w.push_back(static_cast<int64_t>(prefills.size()));
  for (const Prefill& p : prefills) {
    w.push_back(p.slot);
    w.push_back(p.last ? 1 : 0);
    w.push_back(static_cast<int64_t>(p.ids.size()));
    w.insert(w.end(), p.ids.begin(), p.ids.end());
  }
  w.push_back(static_cast<int64_t>(decodes.size()));
  for (const Decode& d : decodes) {
    w.push_back(d.slot);
    w.push_back(d.token);
  }
  return w;
}

StepPlan StepPlan::decode(const std::vector<int64_t>& w) {
  size_t at = 0;
  auto next = [&]() {
    TP_CHECK(at < w.size(), "StepPlan::decode: the plan ends early ({} words)", w.size());
    return w[at++];
  };
  auto count = [&]() {
    int64_t n = next();
    TP_CHECK(n >= 0 && static_cast<size_t>(n) <= w.size() - at, "StepPlan::decode: bad count {}", n);
    return n;
  };
  StepPlan p;
  p.stop = next() != 0;
  for (int64_t i = 0, n = count(); i < n; ++i) p.resets.push_back(next());
  for (int64_t i = 0, n = count(); i < n; ++i) {
    Prefill f{next(), {}};
    f.last = next() != 0;
    for (int64_t j = 0, m = count(); j < m; ++j) f.ids.push_back(next());
    p.prefills.push_back(std::move(f));
  }
  for (int64_t i = 0, n = count(); i < n; ++i) {
    int64_t slot = next();
    p.decodes.push_back({slot, next()});
  }
  TP_CHECK(at == w.size(), "StepPlan::decode: {} words left over", w.size() - at);
  return p;
}

StepPlan broadcast_plan(const StepPlan& plan, dist::ProcessGroup& group, int root) {
  if (group.size() == 1) return plan;
  std::vector<int64_t> words = group.rank() == root ? plan.encode() : std::vector<int64_t>{};
  // Its length first, then the words: plans vary in size from step to step.
  // The other ranks wait here while the server is idle: without spinning.
  Tensor size = Tensor::from_ints({static_cast<int64_t>(words.size())}, {1});
  group.broadcast_idle(size, root);
  const int64_t n = size.to_int_vector()[0];
  Tensor body = group.rank() == root ? Tensor::from_ints(words, {n}) : Tensor::zeros({n}, DType::I64);
  group.broadcast(body, root);
  return group.rank() == root ? plan : StepPlan::decode(body.to_int_vector());
}

}  // namespace tp::serving
