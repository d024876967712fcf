#pragma once
// The tensors an architecture's checkpoint holds: Hub names and shapes implied
// by config.json, in Transformers' state_dict order, and the parameter count
// that follows. Pure functions of the config (no tensors are made), so that the
// config fuzzer can drive them; every size product is overflow-checked.
#include <cstdint>
#include <string>
#include <vector>

#include "tp/models/config.h"
#include "tp/tensor/shape.h"

namespace tp {

struct ParamSpec {
  std::string name;
  Shape shape;
  // Like Transformers' _init_weights: Linear/Embedding normal(0, initializer_range),
  // RMSNorm ones, biases zeros.
  enum class Init { Normal, Ones, Zeros } init;
};

// The model types whose checkpoint layout tp knows.
bool has_known_layout(const std::string& model_type);

// Every parameter of the checkpoint. Errors for a model_type it does not know and
// for sizes whose products overflow (naming the keys). Allocates per layer: call
// it only once num_hidden_layers is known to be sane (checked against weights,
// or bounded by check_model_fits).
std::vector<ParamSpec> checkpoint_layout(const ModelConfig& config);

// The parameters of one decoder layer, and of everything outside the layers.
struct LayoutCounts {
  int64_t per_layer = 0;  // parameters (elements) of layer 0
  int64_t outside_layers = 0;
  int64_t tensors_per_layer = 0;
  int64_t total = 0;  // outside_layers + every layer's (MoE: sparse and dense layers each of their size)
};
// Without enumerating the layers; errors name the keys when a count overflows.
LayoutCounts layout_counts(const ModelConfig& config);

}  // namespace tp
