#pragma once
// Calls a decoder makes around its parameter units (FSDP's: each decoder layer
// is one, and the root, everything else, another): training/fsdp.h gathers a
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
  // Before embed_tokens: the root unit's weights are needed from here on.
  virtual void begin_forward() = 0;
  // Before layer i runs on h: returns what the layer should read instead of h.
  virtual Tensor enter_layer(int64_t layer, const Tensor& h) = 0;
  // After layer i returned h: returns what the model should carry on with.
  virtual Tensor leave_layer(int64_t layer, const Tensor& h) = 0;
};

}  // namespace tp
