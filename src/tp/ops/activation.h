#pragma once
// Activations and softmax, f32.
#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor silu(const Tensor& x);                                     // x * sigmoid(x)
Tensor gelu(const Tensor& x, bool tanh_approximation = false);  // "gelu" (erf) / "gelu_pytorch_tanh"
Tensor swiglu(const Tensor& a, const Tensor& b);                  // silu(a) * b, same shapes
Tensor softmax(const Tensor& x, int64_t dim = -1);
// cap * tanh(x / cap), cap > 0: Gemma's logit soft-capping (final_logit_softcapping).
Tensor softcap(const Tensor& x, double cap);

}  // namespace tp::ops
