#pragma once
// The tensors an architecture's checkpoint holds, read off its module tree:
// the tree's parameters know their names and global shapes before any weight
// is loaded, and the architecture's CheckpointNames say where the Hub names a
// tensor differently (MoE experts stored per expert). No per-architecture
// lists here: a new architecture's checkpoint is its module tree.
#include <cstdint>
#include <string>
#include <vector>

#include "tp/models/config.h"
#include "tp/nn/module.h"
#include "tp/tensor/shape.h"

namespace tp {

class CausalLM;

struct ParamSpec {
  std::string name;
  Shape shape;
  using Init = nn::ParamInit;  // Transformers' _init_weights for the owning module
  Init init;
};

// The model types whose checkpoint layout tp knows: those it has a module tree for.
bool has_known_layout(const std::string& model_type);

// Every tensor of the checkpoint, in the module tree's order (tied parameters
// left out, fused experts as the Hub's per-expert tensors). Builds the tree
// (no weights): errors for a model_type tp does not run, for a tree that would
// not fit in memory (check_module_tree_fits), and for sizes whose products
// overflow (naming the tensor).
std::vector<ParamSpec> checkpoint_layout(const ModelConfig& config);
std::vector<ParamSpec> checkpoint_layout(CausalLM& model);

// The parameters of the decoder layers, and of everything outside them.
struct LayoutCounts {
  int64_t in_layers = 0;  // parameters (elements) of all decoder layers
  int64_t outside_layers = 0;
  int64_t layer_tensors = 0;  // tensors of all decoder layers
  int64_t total = 0;          // outside_layers + in_layers
};
LayoutCounts layout_counts(const ModelConfig& config);
// Without building every layer (for a num_hidden_layers too large to build):
// the tensors outside the layers plus num_hidden_layers x layer 0's, counted
// on a one-layer tree. Errors name the count that overflows 64 bits.
int64_t estimated_parameter_count(const ModelConfig& config);

}  // namespace tp
