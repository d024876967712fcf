#pragma once
// Calls a decoder makes around its parameter units (FSDP's: each decoder layer
// is one, and the root, everything else, another; the root is used at the start
// and at the end of the forward, by embed_tokens and by the final norm and lm_head): training/fsdp.h gathers a
// unit's weights on them and, through the identities these return (recorded
// ops whose backward acts), again before the unit's backward and reduces its
// gradients after it. They sit outside a checkpointed layer, so a recompute
// finds the weights its backward gathered: no layer is gathered twice.
#include <cstdint>

#include "tp/tensor/tensor.h"

namespace tp {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Before embed_tokens, and after it (h: its output; returns what the layers
  // should read instead): the root unit's weights are needed between the two.
  virtual void begin_forward() = 0;
  virtual Tensor leave_embedding(const Tensor& h) = 0;
  // Before the final norm (h: its input; returns what it should read instead):
  // the root's weights are needed from here to the end of the forward (lm_head).
  virtual Tensor enter_head(const Tensor& h) = 0;
  // Before layer i runs on h: returns what the layer should read instead of h.
  virtual Tensor enter_layer(int64_t layer, const Tensor& h) = 0;
  // After layer i returned h: returns what the model should carry on with.
  virtual Tensor leave_layer(int64_t layer, const Tensor& h) = 0;
};

}  // namespace tp
