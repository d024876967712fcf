#pragma once
// Finite-difference check of an op's backward, for tests.
#include <functional>
#include <string>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::autograd {

struct GradcheckOptions {
  double eps = 1e-2;   // central-difference step (inputs are f32)
  double atol = 2e-3;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 2e-2;
  uint64_t seed = 1234;  // for the random projection of the output
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // first mismatch: input index, element, both values
};

// `fn` maps the inputs to one output tensor. Checks d<w, fn(x)>/dx for a random
// w against central differences, for every element of every input that
// requires grad (inputs must be f32).
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, std::vector<Tensor> inputs,
                          const GradcheckOptions& options = {});

}  // namespace tp::autograd
