#include "tp/serving/scheduler.h"

#include <algorithm>
#include <utility>

#include "tp/core/error.h"

namespace tp::serving {

Scheduler::Scheduler(const SchedulerOptions& options) : options_(options) {
  TP_CHECK(options.max_num_seqs >= 1, "max_num_seqs must be at least 1, got {}", options.max_num_seqs);
  TP_CHECK(options.max_model_len >= 2, "max_model_len must be at least 2, got {}", options.max_model_len);
  TP_CHECK(options.max_num_batched_tokens >= options.max_num_seqs,
           "max_num_batched_tokens ({}) must be at least max_num_seqs ({}): every running sequence decodes one "
           "token per step",
           options.max_num_batched_tokens, options.max_num_seqs);
  slots_.resize(static_cast<size_t>(options.max_num_seqs));
}

std::shared_ptr<TokenStream> Scheduler::submit(GenerationRequest request) {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  TP_CHECK(n >= 1, "a request needs at least one prompt token");
  TP_CHECK(request.max_tokens >= 1, "max_tokens must be at least 1, got {}", request.max_tokens);
  TP_CHECK(n + request.max_tokens <= options_.max_model_len,
           "prompt ({} tokens) + max_tokens ({}) exceeds the maximum context length {}", n, request.max_tokens,
           options_.max_model_len);
  auto stream = std::make_shared<TokenStream>();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      stream->finish(StreamEnd::Shutdown);
      return stream;
    }
    waiting_.push_back({std::move(request), stream});
  }
  work_.notify_one();
  return stream;
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
}

StepPlan Scheduler::next_step(std::chrono::milliseconds idle_wait) {
  StepPlan plan;
  const bool busy = std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.request.has_value(); });
  std::unique_lock lock(mutex_);
  if (!busy && pending_resets_.empty())
    work_.wait_for(lock, idle_wait, [&] { return stopping_ || !waiting_.empty(); });
  if (stopping_) {
    for (Waiting& w : waiting_) w.stream->finish(StreamEnd::Shutdown);
    waiting_.clear();
    for (Slot& s : slots_)
      if (s.request) s.stream->finish(StreamEnd::Shutdown);
    slots_.assign(slots_.size(), Slot{});
    prefilling_.clear();
    plan.stop = true;
    return plan;
  }
  // Readers that went away give their slots back before anything is planned.
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].request && slots_[i].stream->cancelled()) {
      slots_[i].stream->finish(StreamEnd::Cancelled);
      free_slot(static_cast<int64_t>(i));
    }
  plan.resets = std::exchange(pending_resets_, {});
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].request && slots_[i].prefilled == static_cast<int64_t>(slots_[i].request->prompt.size()))
      plan.decodes.push_back({static_cast<int64_t>(i), slots_[i].last_token});

  int64_t budget = options_.max_num_batched_tokens - static_cast<int64_t>(plan.decodes.size());
  // A prompt in progress has a slot already: it goes on before new ones start.
  for (size_t i = 0; i < prefilling_.size() && budget > 0; ++i) budget -= plan_chunk(plan, prefilling_[i], budget);
  std::erase_if(prefilling_, [&](int64_t slot) {
    const Slot& s = slots_[static_cast<size_t>(slot)];
    return s.prefilled == static_cast<int64_t>(s.request->prompt.size());
  });
  size_t free_at = 0;
  while (!waiting_.empty() && budget > 0) {
    Waiting& w = waiting_.front();
    if (w.stream->cancelled()) {
      w.stream->finish(StreamEnd::Cancelled);
      waiting_.pop_front();
      continue;
    }
    while (free_at < slots_.size() && slots_[free_at].request) ++free_at;
    // First come, first served: a prompt starts with what is left of the
    // step's budget and goes on in the next steps.
    if (free_at == slots_.size()) break;
    Slot& s = slots_[free_at];
    s = Slot{std::move(w.request), std::move(w.stream)};
    waiting_.pop_front();
    const auto slot = static_cast<int64_t>(free_at);
    budget -= plan_chunk(plan, slot, budget);
    if (s.prefilled < static_cast<int64_t>(s.request->prompt.size())) prefilling_.push_back(slot);
  }
  return plan;
}

int64_t Scheduler::plan_chunk(StepPlan& plan, int64_t slot, int64_t budget) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  const std::vector<int64_t>& prompt = s.request->prompt;
  const int64_t n = std::min(budget, static_cast<int64_t>(prompt.size()) - s.prefilled);
  const auto from = prompt.begin() + static_cast<std::ptrdiff_t>(s.prefilled);
  s.prefilled += n;
  plan.prefills.push_back({slot, std::vector<int64_t>(from, from + static_cast<std::ptrdiff_t>(n)),
                           s.prefilled == static_cast<int64_t>(prompt.size())});
  return n;
}

void Scheduler::free_slot(int64_t slot) {
  slots_[static_cast<size_t>(slot)] = Slot{};
  std::erase(prefilling_, slot);
  pending_resets_.push_back(slot);
}

void Scheduler::push_token(int64_t slot, int64_t token) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  TP_CHECK(s.request.has_value(), "Scheduler: a token for slot {}, which holds no sequence", slot);
  ++s.generated;
  s.last_token = token;
  s.stream->push(token);
  const auto& eos = s.request->eos_token_ids;
  if (std::find(eos.begin(), eos.end(), token) != eos.end()) {
    s.stream->finish(StreamEnd::Eos);
    free_slot(slot);
  } else if (s.generated >= s.request->max_tokens) {
    s.stream->finish(StreamEnd::Length);
    free_slot(slot);
  }
}

void Scheduler::complete_step(const StepPlan& plan, const std::vector<int64_t>& prefill_tokens,
                              const std::vector<int64_t>& decode_tokens) {
  const auto ended = static_cast<size_t>(
      std::count_if(plan.prefills.begin(), plan.prefills.end(), [](const StepPlan::Prefill& p) { return p.last; }));
  TP_CHECK(prefill_tokens.size() == ended && decode_tokens.size() == plan.decodes.size(),
           "Scheduler::complete_step: {} + {} tokens for {} prompts' last chunks and {} decodes",
           prefill_tokens.size(), decode_tokens.size(), ended, plan.decodes.size());
  for (size_t i = 0; i < plan.decodes.size(); ++i) push_token(plan.decodes[i].slot, decode_tokens[i]);
  size_t next = 0;
  for (const StepPlan::Prefill& p : plan.prefills)
    if (p.last) push_token(p.slot, prefill_tokens[next++]);
}

const GenerationRequest& Scheduler::request(int64_t slot) const {
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  TP_CHECK(s.request.has_value(), "Scheduler: slot {} holds no sequence", slot);
  return *s.request;
}

int64_t Scheduler::generated(int64_t slot) const { return slots_.at(static_cast<size_t>(slot)).generated; }

int64_t Scheduler::running() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.request.has_value(); });
}

int64_t Scheduler::waiting() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(waiting_.size());
}

}  // namespace tp::serving
