#pragma once
// What every rank does in one step of the batch engine. Rank 0's scheduler
// decides it; broadcast_plan() sends it to the other ranks before the forward,
// so all ranks run the same forwards on the same slots with the same tokens.
#include <cstdint>
#include <vector>

#include "tp/distributed/process_group.h"

namespace tp::serving {

struct StepPlan {
  bool stop = false;               // the server is shutting down: every rank leaves its loop
  std::vector<int64_t> resets;     // slots whose sequence ended: their cache rows start over
  struct Prefill {
    int64_t slot;
    std::vector<int64_t> ids;      // a chunk of the prompt: the next ids after those already cached
    bool last = true;              // it ends the prompt: the step picks the sequence's first token
  };
  std::vector<Prefill> prefills;   // prompts' chunks, each continuing its own row (the same step's forward)
  struct Decode {
    int64_t slot, token;           // the token each running sequence picked last step
  };
  std::vector<Decode> decodes;     // one token for each sequence running

  bool empty() const { return !stop && resets.empty() && prefills.empty() && decodes.empty(); }
  // Flat i64 form: [stop, #resets, resets..., #prefills, (slot, last, n, ids...)..., #decodes, (slot, token)...].
  std::vector<int64_t> encode() const;
  static StepPlan decode(const std::vector<int64_t>& words);
};

// Collective over `group`: every rank returns root's `plan` (others pass anything).
StepPlan broadcast_plan(const StepPlan& plan, dist::ProcessGroup& group, int root = 0);

}  // namespace tp::serving
