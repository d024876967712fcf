#pragma once
// Shard on read: every parameter reads exactly its rank's slice (as decided by
// its style) from the checkpoint, converting dtype on the fly.
#include <map>
#include <string>

#include "tp/models/checkpoint.h"
#include "tp/nn/module.h"

namespace tp {

// Matrices (2-D and up) load as `dtype`; vectors (norms, biases) as f32.
// `tied`: parameter -> checkpoint tensor it shares (read when the parameter's own
// name is absent); a tied parameter with the same slice shares the tensor.
// Each module is finalized (weights packed) as soon as its own parameters are
// in, so the peak memory is the model plus one layer, not two copies of it.
// Without `pack`, modules are not finalized (weights stay plain tensors: training).
void load_parameters(nn::Module& root, const Checkpoint& ckpt, DType dtype,
                     const std::map<std::string, std::string>& tied = {}, bool inference_only = false,
                     bool pack = true);

}  // namespace tp
