#pragma once
// Continuous batching on rank 0: requests wait in a FIFO queue and take one of
// max_num_seqs sequence slots as soon as one is free, joining the running batch
// at the next step; a sequence leaves the batch (its slot is reset and reused)
// when it ends or its reader cancels. Each step processes at most
// max_num_batched_tokens tokens (vLLM's chunked prefill): one per running
// sequence, then chunks of the prompts being prefilled, oldest first, then of
// newly admitted ones, so a long prompt is spread over steps and never stalls
// the running sequences for more than one step's budget. No model and no HTTP
// here: the Engine runs the plans.
//
// Thread safety: submit() and stop() may be called from any thread (the HTTP
// handlers, a signal watcher); the rest only from the model loop.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "tp/serving/step_plan.h"
#include "tp/serving/token_stream.h"

namespace tp::serving {

struct SchedulerOptions {
  int64_t max_num_seqs = 8;
  int64_t max_num_batched_tokens = 8192;
  int64_t max_model_len = 2048;  // prompt + max_tokens of one sequence (a cache row's length)
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);

  // Queues a request (prompt + max_tokens within max_model_len, else
  // tp::Error); its tokens arrive on the stream.
  std::shared_ptr<TokenStream> submit(GenerationRequest request);
  // The next plan is a stop plan; every queued and running stream ends with Shutdown.
  void stop();

  // Waits up to `idle_wait` for work; returns the next step's plan (empty when
  // there is none yet).
  StepPlan next_step(std::chrono::milliseconds idle_wait);
  // After the forwards of `plan`: the token each prompt's last chunk and each
  // decode picked, in the plan's order. Pushes them to their streams and ends the sequences
  // that hit an end-of-sequence id or max_tokens.
  void complete_step(const StepPlan& plan, const std::vector<int64_t>& prefill_tokens,
                     const std::vector<int64_t>& decode_tokens);

  // The request in `slot` and how many tokens it has so far (the sampling step).
  const GenerationRequest& request(int64_t slot) const;
  int64_t generated(int64_t slot) const;

  const SchedulerOptions& options() const { return options_; }
  int64_t running() const;  // slots in use
  int64_t waiting() const;

 private:
  struct Waiting {
    GenerationRequest request;
    std::shared_ptr<TokenStream> stream;
  };
  struct Slot {
    std::optional<GenerationRequest> request;  // unset: free
    std::shared_ptr<TokenStream> stream;
    int64_t generated = 0;
    int64_t last_token = -1;
    int64_t prefilled = 0;  // prompt tokens planned so far; the sequence decodes once all are
  };
  // Plans the next chunk of slot's prompt, at most `budget` tokens; returns its size.
  int64_t plan_chunk(StepPlan& plan, int64_t slot, int64_t budget);
  void push_token(int64_t slot, int64_t token);
  // The slot is free now; the next plan resets its cache row (before any prefill reuses it).
  void free_slot(int64_t slot);

  SchedulerOptions options_;
  mutable std::mutex mutex_;  // guards waiting_ and stopping_
  std::condition_variable work_;
  std::deque<Waiting> waiting_;
  bool stopping_ = false;
  std::vector<Slot> slots_;  // model loop only
  std::vector<int64_t> pending_resets_;
  std::deque<int64_t> prefilling_;  // slots whose prompt is partly prefilled, oldest first
};

}  // namespace tp::serving
