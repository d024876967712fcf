#include "tp/autograd/checkpoint.h"

#include <memory>
#include <optional>

#include "tp/autograd/tape.h"

namespace tp::autograd {
namespace {

// What a checkpoint's forward kept for its recompute: under the selective
// policy the outputs of the ops that keep theirs, by the op's place in the order
// the ops ran (undefined where an op's output was not kept, or superseded), and
// the values drawn under either policy, in order.
struct Kept {
  bool selective = false;
  bool replay = false;
  std::vector<Tensor> outputs;
  size_t next = 0;
  std::vector<uint64_t> values;
  size_t next_value = 0;
};

thread_local Kept* kept = nullptr;

class KeptScope {
 public:
  explicit KeptScope(Kept* k) : previous_(kept) { kept = k; }
  ~KeptScope() { kept = previous_; }
  KeptScope(const KeptScope&) = delete;
  KeptScope& operator=(const KeptScope&) = delete;

 private:
  Kept* previous_;
};

// A new handle on the same values, without the autograd state of the graph it came from.
Tensor fresh_handle(const Tensor& t) {
  if (!t.defined()) return t;
  return Tensor::wrap(t.storage(), t.storage_offset(), t.shape(), t.dtype());
}

}  // namespace

Tensor kept_output() {
  if (kept == nullptr || !kept->selective) return Tensor();
  const size_t op = kept->next++;
  if (!kept->replay) {
    kept->outputs.emplace_back();
    return Tensor();
  }
  TP_CHECK(op < kept->outputs.size(),
           "checkpoint: the recompute ran more kept ops than the forward ({}): the block is not deterministic",
           kept->outputs.size());
  return fresh_handle(kept->outputs[op]);
}

void keep_output(const Tensor& y) {
  if (kept != nullptr && kept->selective && !kept->replay && !kept->outputs.empty()) kept->outputs.back() = y;
}

void drop_kept_output(const Tensor& x) {
  if (kept == nullptr || !kept->selective || kept->replay) return;
  for (Tensor& t : kept->outputs)
    if (t.defined() && t.same_storage(x)) t = Tensor();
}

std::optional<uint64_t> replayed_value() {
  if (kept == nullptr || !kept->replay) return std::nullopt;
  TP_CHECK(kept->next_value < kept->values.size(),
           "checkpoint: the recompute asked for more values than the forward kept ({})", kept->values.size());
  return kept->values[kept->next_value++];
}

void keep_value(uint64_t value) {
  if (kept != nullptr && !kept->replay) kept->values.push_back(value);
}

std::vector<Tensor> checkpoint(const Block& block, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params, CheckpointPolicy policy) {
  if (!needs_grad(inputs) && !needs_grad(params)) return block(inputs);
  auto keep = std::make_shared<Kept>();
  keep->selective = policy == CheckpointPolicy::Selective;
  Kept* scope_keep = keep.get();
  std::vector<Tensor> outputs;
  {
    // The same (recording) forward as without checkpointing, so the recompute
    // repeats its kernels exactly; its tape goes once the outputs exist.
    const size_t mark = tape_size();
    KeptScope scope(scope_keep);
    outputs = block(inputs);
    truncate_tape(mark);
  }
  for (Tensor& out : outputs) out = fresh_handle(out);
  std::vector<Tensor> recorded = inputs;
  recorded.insert(recorded.end(), params.begin(), params.end());
  const size_t n_params = params.size();
  record("checkpoint", recorded, outputs,
         [block, inputs, n_params, keep, scope_keep](const std::vector<Tensor>& grads) {
           GradModeGuard grad_on(true);
           std::vector<Tensor> detached;
           for (const Tensor& x : inputs) {
             Tensor d = fresh_handle(x);
             if (x.defined() && x.requires_grad()) d.set_requires_grad(true);
             detached.push_back(d);
           }
           keep->replay = true;
           keep->next = keep->next_value = 0;
           std::vector<Tensor> outs;
           {
             KeptScope scope(scope_keep);
             outs = block(detached);
           }
           TP_CHECK(keep->next == keep->outputs.size(),
                    "checkpoint: the recompute ran {} kept ops, the forward {}: the block is not deterministic",
                    keep->next, keep->outputs.size());
           TP_CHECK(keep->next_value == keep->values.size(),
                    "checkpoint: the recompute asked for {} kept values, the forward kept {}", keep->next_value,
                    keep->values.size());
           keep->outputs.clear();
           TP_CHECK(outs.size() == grads.size(), "checkpoint: the recompute returned {} outputs, the forward {}",
                    outs.size(), grads.size());
           std::vector<Tensor> roots, root_grads;
           for (size_t i = 0; i < outs.size(); ++i) {
             if (!outs[i].requires_grad() || (i > 0 && max_abs(grads[i]) == 0)) continue;
             roots.push_back(outs[i]);
             root_grads.push_back(grads[i]);
           }
           if (!roots.empty()) backward(roots, root_grads);
           std::vector<Tensor> result;
           for (const Tensor& d : detached) result.push_back(d.defined() && d.requires_grad() ? d.grad() : Tensor());
           result.resize(result.size() + n_params);  // delivered by the recompute's backward
           return result;
         });
  return outputs;
}

}  // namespace tp::autograd
