#include "tp/autograd/tape.h"

#include <algorithm>
#include <unordered_map>

#include "tp/autograd/grad_state.h"
#include "tp/tensor/accumulate.h"

namespace tp {

// ---- Tensor's autograd accessors live here, next to the state they read.

bool Tensor::requires_grad() const {
  auto& state = impl()->grad_state;
  return state && state->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool on) {
  TP_CHECK(defined(), "set_requires_grad on an undefined tensor");
  auto& state = impl()->grad_state;
  if (!state) state = std::make_shared<autograd::TensorGradState>();
  TP_CHECK(on || state->is_leaf, "set_requires_grad(false) on a tensor produced by a recorded op");
  TP_CHECK(!on || is_floating(dtype()), "only floating-point tensors can require gradients, not {}",
           dtype_name(dtype()));
  state->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  auto& state = impl()->grad_state;
  return state ? state->grad : Tensor();
}

void Tensor::zero_grad() {
  auto& state = impl()->grad_state;
  if (state) state->grad = Tensor();
}

void Tensor::set_grad(const Tensor& buffer) {
  TP_CHECK(requires_grad(), "set_grad on a tensor that does not require grad");
  auto& state = impl()->grad_state;
  TP_CHECK(state->is_leaf, "set_grad on a tensor produced by a recorded op (only leaves keep gradients)");
  TP_CHECK(!buffer.defined() || buffer.shape() == shape(), "set_grad: buffer shape {} differs from the tensor's {}",
           shape_str(buffer.shape()), shape_str(shape()));
  TP_CHECK(!buffer.defined() || is_floating(buffer.dtype()), "set_grad: the buffer must be floating point, not {}",
           dtype_name(buffer.dtype()));
  state->grad = buffer;
}

namespace autograd {
namespace {

thread_local bool grad_enabled = true;

// What the engine keeps of an op's input: where its gradient goes, not its data.
// The tensor's values live only as long as something else holds them (the
// closure that saved them, the caller), so a backward frees each activation as
// soon as the last closure that saved it has run.
struct InputRef {
  std::shared_ptr<TensorGradState> state;  // null: undefined, or never took part in autograd
  Tensor leaf;                             // a leaf itself (parameters: alive anyway), for its gradient buffer
  Shape shape;
  const Storage* storage = nullptr;  // identity only: a gradient aliasing the input is copied before it is kept
};

struct TapeEntry {
  const char* name;
  std::vector<InputRef> inputs;
  std::vector<std::weak_ptr<TensorGradState>> outputs;  // a dead output cannot receive a gradient
  std::vector<Shape> output_shapes;
  BackwardFn fn;
};

thread_local std::vector<TapeEntry> tape;
thread_local std::function<void(const TensorImpl*)> leaf_ready_hook;
// Backwards running on this thread: a checkpointed block's backward runs its own
// inside the outer one, whose leaf-ready reports alone are the real ones.
thread_local int backward_depth = 0;

// Adds this backward's gradient `g` of a leaf into the leaf's gradient.
void deliver_leaf_grad(const Tensor& leaf, const Tensor& g) {
  auto& state = leaf.impl()->grad_state;
  if (state->by_rows) {
    add_grad_by_rows(*state->by_rows, g);
  } else if (!state->grad.defined()) {
    // A copy: g may be shared with another leaf's gradient, and the next
    // backward accumulates into this one in place.
    state->grad = g.dtype() == leaf.dtype() ? g.clone() : g.to(leaf.dtype());
  } else {
    accumulate_into(state->grad, g);
  }
}

}  // namespace

bool is_grad_enabled() { return grad_enabled; }

LeafGradReadyHook::LeafGradReadyHook(std::function<void(const TensorImpl*)> on_ready)
    : previous_(std::move(leaf_ready_hook)) {
  leaf_ready_hook = std::move(on_ready);
}
LeafGradReadyHook::~LeafGradReadyHook() { leaf_ready_hook = std::move(previous_); }

NoGradGuard::NoGradGuard() : previous_(grad_enabled) { grad_enabled = false; }
NoGradGuard::~NoGradGuard() { grad_enabled = previous_; }
GradModeGuard::GradModeGuard(bool enabled) : previous_(grad_enabled) { grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { grad_enabled = previous_; }

void set_leaf_by_rows(const Tensor& leaf, std::shared_ptr<LeafByRows> by_rows) {
  TP_CHECK(leaf.defined() && leaf.requires_grad() && leaf.impl()->grad_state->is_leaf && leaf.dim() >= 1,
           "set_leaf_by_rows: only a leaf that requires grad is held by rows");
  leaf.impl()->grad_state->by_rows = std::move(by_rows);
}

LeafByRows* leaf_by_rows(const Tensor& t) {
  if (!t.defined()) return nullptr;
  const auto& state = t.impl()->grad_state;
  return state && state->is_leaf ? state->by_rows.get() : nullptr;
}

void add_grad_by_rows(LeafByRows& by_rows, const Tensor& g) {
  const Tensor rows = g.dtype() == DType::F32 ? g : g.to(DType::F32);
  const int64_t n = rows.size(0), step = std::max<int64_t>(by_rows.block_rows(), 1);
  for (int64_t r0 = 0; r0 < n; r0 += step) {
    Tensor block = by_rows.begin_grad_block(r0, std::min(step, n - r0));
    block.copy_from(rows.narrow(0, r0, block.size(0)));
    by_rows.end_grad_block();
  }
}

Tensor leaf_grad_buffer(const Tensor& t) {
  if (!t.defined()) return Tensor();
  const auto& state = t.impl()->grad_state;
  if (!state || !state->is_leaf || !state->requires_grad || !state->grad.defined() || state->by_rows) return Tensor();
  if (state->grad.dtype() != DType::F32 || state->grad.shape() != t.shape()) return Tensor();
  return state->grad;
}

namespace {

template <class Tensors>
bool any_requires_grad(const Tensors& inputs) {
  if (!grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

}  // namespace

bool needs_grad(const std::vector<Tensor>& inputs) { return any_requires_grad(inputs); }
bool needs_grad(std::initializer_list<Tensor> inputs) { return any_requires_grad(inputs); }

const Tensor& Rebuild::get() {
  if (!value.defined()) value = make();
  return value;
}

const Tensor& Rebuild::get_bf16() {
  if (!bf16_value.defined()) bf16_value = get().to(DType::BF16);
  return bf16_value;
}

void set_rebuild(const Tensor& out, std::function<Tensor()> make) {
  auto& state = out.impl()->grad_state;
  TP_CHECK(state != nullptr, "set_rebuild: {} is not the output of a recorded op", shape_str(out.shape()));
  state->rebuild = std::make_shared<Rebuild>(Rebuild{std::move(make), {}, {}});
}

std::shared_ptr<Rebuild> rebuild_of(const Tensor& t) {
  if (!t.defined() || t.impl()->grad_state == nullptr) return nullptr;
  return t.impl()->grad_state->rebuild;
}

void accumulate_into(Tensor& dst, const Tensor& src) { add_into(dst, src); }

void record(const char* name, std::vector<Tensor> inputs, std::vector<Tensor> outputs, BackwardFn backward_fn) {
  TapeEntry e{name, {}, {}, {}, std::move(backward_fn)};
  e.inputs.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    InputRef ref;
    if (in.defined()) {
      ref.state = in.impl()->grad_state;
      if (ref.state && ref.state->is_leaf) ref.leaf = in;
      ref.shape = in.shape();
      ref.storage = in.storage().get();
    }
    e.inputs.push_back(std::move(ref));
  }
  for (Tensor& out : outputs) {
    auto& state = out.impl()->grad_state;
    if (!state) state = std::make_shared<TensorGradState>();
    state->requires_grad = true;
    state->is_leaf = false;
    e.output_shapes.push_back(out.shape());
    e.outputs.push_back(state);
  }
  tape.push_back(std::move(e));
}

namespace {

bool wants_grad(const InputRef& in) { return in.state && in.state->requires_grad; }
bool trainable_leaf(const InputRef& in) { return in.state && in.state->is_leaf && in.state->requires_grad; }

}  // namespace

void backward(const Tensor& root, const Tensor& grad_root) { backward(std::vector<Tensor>{root}, {grad_root}); }

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots) {
  TP_CHECK(grad_roots.size() == roots.size(), "backward: {} gradients for {} roots", grad_roots.size(), roots.size());
  // Gradients in flight, keyed by the tensor's autograd state (which this map
  // keeps alive: the tensor itself may already be gone).
  struct InFlight {
    std::shared_ptr<TensorGradState> state;
    Tensor grad;
    Tensor leaf;  // defined for a leaf
  };
  std::unordered_map<const TensorGradState*, InFlight> grads;
  auto add_grad = [&](const std::shared_ptr<TensorGradState>& state, const Tensor& leaf, const Tensor& g,
                      const Storage* aliased) {
    auto it = grads.find(state.get());
    if (it == grads.end()) {
      grads.emplace(state.get(), InFlight{state, aliased != nullptr && g.storage().get() == aliased ? g.clone() : g, leaf});
    } else {
      // Out of place: a backward may hand the same tensor to several inputs
      // (add gives g to both), so the stored gradient can be aliased.
      Tensor sum = it->second.grad.to(DType::F32).clone();
      accumulate_into(sum, g);
      it->second.grad = sum;
    }
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    TP_CHECK(root.defined() && root.requires_grad(),
             "backward: the root tensor does not require grad (was it computed under NoGradGuard, or from "
             "inputs without requires_grad?)");
    Tensor seed = grad_roots[i];
    if (!seed.defined()) {
      TP_CHECK(root.numel() == 1, "backward: grad_root can be omitted only for a one-element root, got shape {}",
               shape_str(root.shape()));
      seed = Tensor::full(root.shape(), 1.0, DType::F32);
    }
    check_same_shape(root, seed, "backward: grad_root vs root");
    add_grad(root.impl()->grad_state, root.impl()->grad_state->is_leaf ? root : Tensor(), seed.to(DType::F32).clone(),
             nullptr);
  }

  NoGradGuard no_grad;  // backward closures must not record (a checkpoint's recompute turns it back on)
  struct Depth {
    Depth() { ++backward_depth; }
    ~Depth() { --backward_depth; }
  } depth;
  const bool report = leaf_ready_hook && backward_depth == 1;

  // Entries this backward does not reach (another graph recorded in between)
  // stay on the tape, in order, for their own backward.
  std::vector<TapeEntry> entries = std::move(tape);
  tape.clear();
  std::vector<bool> keep(entries.size(), false);
  // With a hook: each leaf's last use (the oldest entry that takes it as input).
  std::unordered_map<const TensorGradState*, size_t> last_use;
  if (report)
    for (size_t i = entries.size(); i-- > 0;)
      for (const InputRef& in : entries[i].inputs)
        if (trainable_leaf(in)) last_use[in.state.get()] = i;
  for (size_t index = entries.size(); index-- > 0;) {
    TapeEntry& e = entries[index];
    std::vector<Tensor> grad_outputs(e.outputs.size());
    bool any = false, alive = false;
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      auto out = e.outputs[i].lock();
      if (!out) continue;
      alive = true;
      auto g = grads.find(out.get());
      if (g == grads.end()) continue;
      // Closures work in f32 (a to_dtype backward may have produced bf16).
      grad_outputs[i] = g->second.grad.to(DType::F32);
      grads.erase(g);
      any = true;
    }
    if (!any) {
      keep[index] = alive;
      if (!alive) e = TapeEntry{};  // nothing can reach it any more: free what it saved now
      continue;
    }
    for (size_t i = 0; i < grad_outputs.size(); ++i)
      if (!grad_outputs[i].defined()) grad_outputs[i] = Tensor::zeros(e.output_shapes[i], DType::F32);
    std::vector<Tensor> grad_inputs = e.fn(grad_outputs);
    e.fn = nullptr;  // the closure's saved tensors go now, not when the backward returns
    grad_outputs.clear();
    TP_CHECK(grad_inputs.size() == e.inputs.size(), "backward of '{}' returned {} gradients for {} inputs", e.name,
             grad_inputs.size(), e.inputs.size());
    for (size_t i = 0; i < grad_inputs.size(); ++i) {
      const InputRef& in = e.inputs[i];
      if (!grad_inputs[i].defined() || !wants_grad(in)) continue;
      TP_CHECK(grad_inputs[i].shape() == in.shape, "backward of '{}': gradient {} for input {} of shape {}", e.name,
               shape_str(grad_inputs[i].shape()), i, shape_str(in.shape));
      add_grad(in.state, in.leaf, grad_inputs[i], in.storage);
    }
    grad_inputs.clear();
    if (report) {
      for (const InputRef& in : e.inputs) {
        if (!in.state) continue;
        auto last = last_use.find(in.state.get());
        if (last == last_use.end() || last->second != index) continue;
        last_use.erase(last);  // an entry may list the same leaf twice
        if (auto g = grads.find(in.state.get()); g != grads.end()) {
          deliver_leaf_grad(in.leaf, g->second.grad);
          grads.erase(g);
        }
        leaf_ready_hook(in.leaf.impl());
      }
    }
    e = TapeEntry{};
  }
  for (size_t i = 0; i < entries.size(); ++i)
    if (keep[i]) tape.push_back(std::move(entries[i]));
  entries.clear();
  // What is left belongs to leaves (and to non-leaf roots nobody consumed).
  for (auto& [key, g] : grads)
    if (g.leaf.defined() && g.state->requires_grad) deliver_leaf_grad(g.leaf, g.grad);
}

size_t tape_size() { return tape.size(); }
void clear_tape() { tape.clear(); }
void truncate_tape(size_t size) {
  if (size < tape.size()) tape.erase(tape.begin() + static_cast<std::ptrdiff_t>(size), tape.end());
}

}  // namespace autograd
}  // namespace tp
