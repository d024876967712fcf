#include "tp/serving/engine.h"

#include <algorithm>

#include "tp/autograd/tape.h"
#include "tp/ops/sampling.h"
#include "tp/ops/shape.h"

namespace tp::serving {

Engine::Engine(PretrainedModel& model, const SchedulerOptions& options)
    : model_(model), group_(model.mesh().root_group()) {
  const int64_t context = model.config().max_position_embeddings;
  TP_CHECK(context == 0 || options.max_model_len <= context,
           "max_model_len {} exceeds the model's max_position_embeddings {}", options.max_model_len, context);
  if (group_.rank() == 0) scheduler_ = std::make_unique<Scheduler>(options);
  state_ = model.lm().make_kv_state(options.max_num_seqs, options.max_model_len);
}

Scheduler& Engine::scheduler() {
  TP_CHECK(scheduler_ != nullptr, "the scheduler lives on the mesh's root rank 0 (this is rank {})", group_.rank());
  return *scheduler_;
}

int64_t Engine::kv_cache_bytes() const {
  int64_t bytes = 0;
  for (const ops::KVCache& c : state_.layers) bytes += static_cast<int64_t>(c.keys().nbytes() + c.values().nbytes());
  return bytes;
}

void Engine::run(const std::function<bool()>& stop_requested) {
  const bool root = this->root();
  std::vector<int64_t> prefill_tokens, decode_tokens;
  for (;;) {
    StepPlan plan;
    if (root) {
      if (stop_requested && stop_requested()) scheduler_->stop();
      // The wait is short so that a stop request is seen soon.
      plan = scheduler_->next_step(std::chrono::milliseconds(50));
      if (plan.empty()) continue;
    }
    plan = broadcast_plan(plan, group_);
    if (plan.stop) return;
    execute(plan, prefill_tokens, decode_tokens);
    if (root) scheduler_->complete_step(plan, prefill_tokens, decode_tokens);
    ++steps_;
  }
}

int64_t Engine::pick(const Tensor& logits, int64_t row, int64_t slot) const {
  const GenerationRequest& r = scheduler_->request(slot);
  // Stream 0 and the token's index: the random stream of `tp generate` with this prompt alone.
  return ops::sample_tokens(ops::narrow(logits, 0, row, 1), r.sampling, {0}, {scheduler_->generated(slot)})
      .to_int_vector()
      .front();
}

void Engine::execute(const StepPlan& plan, std::vector<int64_t>& prefill_tokens,
                     std::vector<int64_t>& decode_tokens) {
  autograd::NoGradGuard no_grad;
  CausalLM& lm = model_.lm();
  const bool root = this->root();
  prefill_tokens.clear();
  decode_tokens.clear();
  for (int64_t slot : plan.resets) state_.reset(slot);

  for (const StepPlan::Prefill& p : plan.prefills) {
    const int64_t T = static_cast<int64_t>(p.ids.size());
    KVState row = state_.rows(p.slot, 1);
    Tensor logits =
        lm.forward_ids(Tensor::from_ints(p.ids, {1, T}), {.cache = &row, .counts = {T}, .logit_positions = {T - 1}})
            .logits;
    state_.take_lengths(row, p.slot);
    if (root && p.last) prefill_tokens.push_back(pick(logits, 0, p.slot));
  }

  if (!plan.decodes.empty()) {
    int64_t rows = 0;
    for (const StepPlan::Decode& d : plan.decodes) rows = std::max(rows, d.slot + 1);
    std::vector<int64_t> ids(static_cast<size_t>(rows), 0), counts(static_cast<size_t>(rows), 0);
    for (const StepPlan::Decode& d : plan.decodes) {
      ids[static_cast<size_t>(d.slot)] = d.token;
      counts[static_cast<size_t>(d.slot)] = 1;
    }
    KVState view = state_.rows(0, rows);
    Tensor logits = lm.forward_ids(Tensor::from_ints(ids, {rows, 1}),
                                   {.cache = &view,
                                    .counts = counts,
                                    .logit_positions = std::vector<int64_t>(static_cast<size_t>(rows), 0)})
                        .logits;
    state_.take_lengths(view, 0);
    if (root)
      for (const StepPlan::Decode& d : plan.decodes) decode_tokens.push_back(pick(logits, d.slot, d.slot));
  }
}

}  // namespace tp::serving
