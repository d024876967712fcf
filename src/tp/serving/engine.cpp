#include "tp/serving/engine.h"

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
  const bool root = this->root();
  prefill_tokens.clear();
  decode_tokens.clear();
  for (int64_t slot : plan.resets) state_.reset(slot);
  if (plan.prefills.empty() && plan.decodes.empty()) return;

  // One packed forward: the prompts' chunks, then each running sequence's token,
  // every one a segment on its own slot's row (idle slots are not computed).
  // Logits only where a token is picked: a prompt's last chunk's last token,
  // every decode's token.
  ForwardOptions options{.cache = &state_};
  std::vector<int64_t> ids;
  for (const StepPlan::Prefill& p : plan.prefills) {
    ids.insert(ids.end(), p.ids.begin(), p.ids.end());
    options.segments.push_back({.row = p.slot, .tokens = static_cast<int64_t>(p.ids.size())});
    if (p.last) options.logit_positions.push_back(static_cast<int64_t>(ids.size()) - 1);
  }
  for (const StepPlan::Decode& d : plan.decodes) {
    ids.push_back(d.token);
    options.segments.push_back({.row = d.slot, .tokens = 1, .decode = true});
    options.logit_positions.push_back(static_cast<int64_t>(ids.size()) - 1);
  }
  const Tensor packed = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
  CausalLM& lm = model_.lm();
  if (options.logit_positions.empty()) {  // only prompts' inner chunks: no lm_head
    lm.forward_hidden(packed, options);
    return;
  }
  const Tensor logits = lm.forward_ids(packed, options).logits;  // [picked tokens, V]
  if (!root) return;
  int64_t row = 0;
  for (const StepPlan::Prefill& p : plan.prefills)
    if (p.last) prefill_tokens.push_back(pick(logits, row++, p.slot));
  for (const StepPlan::Decode& d : plan.decodes) decode_tokens.push_back(pick(logits, row++, d.slot));
}

}  // namespace tp::serving
