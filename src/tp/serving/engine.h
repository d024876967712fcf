#pragma once
// The batch engine: every rank of the model's mesh (tp, and the expert-parallel
// ranks around it) holds a KV cache of max_num_seqs rows (one per sequence slot,
// max_model_len tokens each) and runs the same steps. The mesh's root rank's
// scheduler plans each step; the plan is broadcast over the mesh; then every rank
//   1. resets the rows of the sequences that ended,
//   2. runs one packed forward (ForwardOptions::segments) over every planned
//      chunk of a prompt and every running sequence's next token, each on its
//      own slot's row: the weights are read once for the whole step, idle slots
//      are not computed, and each token gets the bits it gets in `tp generate`
//      of its prompt alone (tested: test_engine, test_models' packed steps),
// and the root picks each sequence's next token with its own sampling options.
#include <functional>

#include "tp/models/auto.h"
#include "tp/serving/scheduler.h"

namespace tp::serving {

class Engine {
 public:
  // Every rank (collective only in run()).
  Engine(PretrainedModel& model, const SchedulerOptions& options);
  // Whether this is the mesh's root rank, where requests go in.
  bool root() const { return scheduler_ != nullptr; }
  // The root's: where requests go in. Error on other ranks.
  Scheduler& scheduler();
  // Every rank, main thread: runs steps until the root stops, which it does when
  // `stop_requested` (polled on the root between steps) returns true or
  // scheduler().stop() is called. The root broadcasts a stop plan, so every rank
  // returns.
  void run(const std::function<bool()>& stop_requested = {});

  int64_t kv_cache_bytes() const;
  int64_t steps() const { return steps_; }

 private:
  // Runs `plan` on this rank; the root also picks the tokens.
  void execute(const StepPlan& plan, std::vector<int64_t>& prefill_tokens, std::vector<int64_t>& decode_tokens);
  int64_t pick(const Tensor& logits, int64_t row, int64_t slot) const;

  PretrainedModel& model_;
  dist::ProcessGroup& group_;  // the mesh's every rank
  std::unique_ptr<Scheduler> scheduler_;  // the root only
  KVState state_;
  int64_t steps_ = 0;
};

}  // namespace tp::serving
