#pragma once
#include "tp/tensor/tensor.h"

namespace tp::autograd {

// Per-tensor autograd state, created the first time a tensor takes part in
// autograd (set_requires_grad or as the output of a recorded op).
struct TensorGradState {
  bool requires_grad = false;
  bool is_leaf = true;  // created by the user, not by a recorded op
  Tensor grad;          // accumulated gradient (leaves only)
};

}  // namespace tp::autograd
