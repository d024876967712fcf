#pragma once
#include <functional>
#include <memory>

#include "tp/tensor/tensor.h"

namespace tp::autograd {

class LeafByRows;  // tape.h

// How to make a tensor's values again instead of keeping them (an all-gathered
// sequence: gather the shard again). An op that saves such an input for its
// backward keeps this instead; the first backward that asks makes the values
// once, and they live as long as any op that saved them is alive.
struct Rebuild {
  std::function<Tensor()> make;
  Tensor value, bf16_value;
  const Tensor& get();
  const Tensor& get_bf16();  // the values rounded to bf16 (made once, for all who ask)
};

// Per-tensor autograd state, created the first time a tensor takes part in
// autograd (set_requires_grad or as the output of a recorded op).
struct TensorGradState {
  bool requires_grad = false;
  bool is_leaf = true;  // created by the user, not by a recorded op
  Tensor grad;          // accumulated gradient (leaves only)
  std::shared_ptr<Rebuild> rebuild;  // set by the op that made the tensor, when it can make it again
  std::shared_ptr<LeafByRows> by_rows;  // a leaf held by blocks of rows (tape.h)
};

}  // namespace tp::autograd
