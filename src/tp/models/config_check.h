#pragma once
// Does config.json agree with the weights next to it? Checked from the tensor
// index alone (names, shapes, dtypes from the safetensors headers) before any
// module is built or any tensor read, so that a config that contradicts its
// weights (a typo, a hand edit, a config from another model) is an error naming
// the key, its value and what the weights hold, in time and memory that depend
// on the number of tensors, never on the config's sizes.
#include <string>
#include <unordered_map>

#include "tp/io/safetensors_header.h"
#include "tp/models/config.h"
#include "tp/tensor/storage.h"  // physical_memory_bytes

namespace tp {

// Every tensor of a directory's weight files, by name.
using TensorIndex = std::unordered_map<std::string, const io::TensorInfo*>;

// The summary checks first (layer count; hidden, vocab and intermediate sizes;
// heads x head_dim; tied embeddings), then every tensor of the layout with its
// shape and a floating dtype. Model types without a known layout are not checked.
// `config_file` and `weights_dir` are named in the errors.
void check_config_against_weights(const ModelConfig& config, const TensorIndex& tensors, const std::string& config_file,
                                  const std::string& weights_dir);

// Where there are no weights to check against (`tp plan` on a config alone):
// a layer count whose bare module tree would take more than half of
// `memory_bytes` is an error naming the key (and the parameter count, or the
// count that overflows 64 bits), before anything is allocated per layer. Sizes
// whose products overflow fail as the tree is built, naming the tensor.
// AutoModelForCausalLM::from_config calls it with physical_memory_bytes().
void check_module_tree_fits(const ModelConfig& config, int64_t memory_bytes);

// What building the module tree costs per decoder layer (modules, parameter
// records, names; no weights), with margin: test_io measures it.
inline constexpr int64_t kModuleTreeBytesPerLayer = 16 << 10;

}  // namespace tp
