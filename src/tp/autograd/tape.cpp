#include "tp/autograd/tape.h"

#include <unordered_map>

#include "tp/autograd/grad_state.h"

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

struct TapeEntry {
  const char* name;
  std::vector<Tensor> inputs;
  std::vector<std::weak_ptr<TensorImpl>> outputs;  // a dead output cannot receive a gradient
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  BackwardFn fn;
};

thread_local std::vector<TapeEntry> tape;
thread_local std::function<void(const TensorImpl*)> leaf_ready_hook;

bool is_trainable_leaf(const TensorImpl* impl) {
  const auto& state = impl->grad_state;
  return state && state->is_leaf && state->requires_grad;
}

// Adds this backward's gradient `g` of a leaf into the leaf's gradient.
void deliver_leaf_grad(TensorImpl* impl, const Tensor& g) {
  auto& state = impl->grad_state;
  if (!state->grad.defined()) {
    // A copy: g may be shared with another leaf's gradient, and the next
    // backward accumulates into this one in place.
    state->grad = g.dtype() == impl->dtype ? g.clone() : g.to(impl->dtype);
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

Tensor leaf_grad_buffer(const Tensor& t) {
  if (!t.defined()) return Tensor();
  const auto& state = t.impl()->grad_state;
  if (!state || !state->is_leaf || !state->requires_grad || !state->grad.defined()) return Tensor();
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

void accumulate_into(Tensor& dst, const Tensor& src) {
  check_same_shape(dst, src, "gradient accumulation");
  int64_t n = dst.numel();
  if (dst.dtype() == DType::F32 && src.dtype() == DType::F32) {
    float* d = dst.data<float>();
    const float* s = src.data<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    return;
  }
  Tensor a = dst.to(DType::F32).clone(), b = src.to(DType::F32);
  float* d = a.data<float>();
  const float* s = b.data<float>();
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  dst.copy_from(a);
}

void record(const char* name, std::vector<Tensor> inputs, std::vector<Tensor> outputs, BackwardFn backward_fn) {
  TapeEntry e{name, std::move(inputs), {}, {}, {}, std::move(backward_fn)};
  for (Tensor& out : outputs) {
    auto& state = out.impl()->grad_state;
    if (!state) state = std::make_shared<TensorGradState>();
    state->requires_grad = true;
    state->is_leaf = false;
    e.output_shapes.push_back(out.shape());
    e.output_dtypes.push_back(out.dtype());
    e.outputs.push_back(out.impl_ptr());
  }
  tape.push_back(std::move(e));
}

void backward(const Tensor& root, const Tensor& grad_root) {
  TP_CHECK(root.defined() && root.requires_grad(),
           "backward: the root tensor does not require grad (was it computed under NoGradGuard, or from "
           "inputs without requires_grad?)");
  Tensor seed = grad_root;
  if (!seed.defined()) {
    TP_CHECK(root.numel() == 1, "backward: grad_root can be omitted only for a one-element root, got shape {}",
             shape_str(root.shape()));
    seed = Tensor::full(root.shape(), 1.0, DType::F32);
  }
  check_same_shape(root, seed, "backward: grad_root vs root");

  NoGradGuard no_grad;  // backward closures must not record
  std::unordered_map<const TensorImpl*, Tensor> grads;
  grads[root.impl()] = seed.to(DType::F32).clone();

  auto add_grad = [&](const Tensor& input, const Tensor& g) {
    auto it = grads.find(input.impl());
    if (it == grads.end()) {
      grads.emplace(input.impl(), g.same_storage(input) ? g.clone() : g);
    } else {
      // Out of place: a backward may hand the same tensor to several inputs
      // (add gives g to both), so the stored gradient can be aliased.
      Tensor sum = it->second.to(DType::F32).clone();
      accumulate_into(sum, g);
      it->second = sum;
    }
  };

  // Entries this backward does not reach (another graph recorded in between)
  // stay on the tape, in order, for their own backward.
  std::vector<TapeEntry> entries = std::move(tape);
  tape.clear();
  std::vector<bool> keep(entries.size(), false);
  // With a hook: each leaf's last use (the oldest entry that takes it as input).
  std::unordered_map<const TensorImpl*, size_t> last_use;
  if (leaf_ready_hook)
    for (size_t i = entries.size(); i-- > 0;)
      for (const Tensor& in : entries[i].inputs)
        if (in.defined() && is_trainable_leaf(in.impl())) last_use[in.impl()] = i;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    TapeEntry& e = *it;
    const size_t index = static_cast<size_t>(entries.rend() - it - 1);
    std::vector<Tensor> grad_outputs(e.outputs.size());
    bool any = false, alive = false;
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      auto out = e.outputs[i].lock();
      if (!out) continue;
      alive = true;
      auto g = grads.find(out.get());
      if (g == grads.end()) continue;
      // Closures work in f32 (a to_dtype backward may have produced bf16).
      grad_outputs[i] = g->second.to(DType::F32);
      grads.erase(g);
      any = true;
    }
    if (!any) {
      keep[index] = alive;
      continue;
    }
    for (size_t i = 0; i < grad_outputs.size(); ++i)
      if (!grad_outputs[i].defined()) grad_outputs[i] = Tensor::zeros(e.output_shapes[i], DType::F32);
    std::vector<Tensor> grad_inputs = e.fn(grad_outputs);
    TP_CHECK(grad_inputs.size() == e.inputs.size(), "backward of '{}' returned {} gradients for {} inputs", e.name,
             grad_inputs.size(), e.inputs.size());
    for (size_t i = 0; i < grad_inputs.size(); ++i) {
      const Tensor& in = e.inputs[i];
      if (!grad_inputs[i].defined() || !in.defined() || !in.requires_grad()) continue;
      TP_CHECK(grad_inputs[i].shape() == in.shape(), "backward of '{}': gradient {} for input {} of shape {}", e.name,
               shape_str(grad_inputs[i].shape()), i, shape_str(in.shape()));
      add_grad(in, grad_inputs[i]);
    }
    if (!leaf_ready_hook) continue;
    for (const Tensor& in : e.inputs) {
      if (!in.defined()) continue;
      auto last = last_use.find(in.impl());
      if (last == last_use.end() || last->second != index) continue;
      last_use.erase(last);  // an entry may list the same leaf twice
      if (auto g = grads.find(in.impl()); g != grads.end()) {
        deliver_leaf_grad(in.impl(), g->second);
        grads.erase(g);
      }
      leaf_ready_hook(in.impl());
    }
  }
  for (size_t i = 0; i < entries.size(); ++i)
    if (keep[i]) tape.push_back(std::move(entries[i]));
  // What is left belongs to leaves (and to non-leaf roots nobody consumed).
  for (auto& [impl, g] : grads)
    if (is_trainable_leaf(impl)) deliver_leaf_grad(const_cast<TensorImpl*>(impl), g);
}

size_t tape_size() { return tape.size(); }
void clear_tape() { tape.clear(); }

}  // namespace autograd
}  // namespace tp
