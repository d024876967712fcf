#pragma once
// Architecture presets for `tp make-model`: the config.json of real models (and
// tiny ones for tests) and the initial values of each parameter of the layout
// (tp/models/layout.h).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tp/models/config.h"
#include "tp/models/layout.h"
#include "tp/tensor/tensor.h"

namespace tp {

// arch: one of preset_architectures(). Errors list the valid architectures / presets.
ModelConfig make_preset_config(const std::string& arch, const std::string& preset);
std::vector<std::string> preset_names(const std::string& arch);
std::vector<std::string> preset_architectures();

// The seed of one parameter: depends on the model seed and the name only, so a
// parameter's values do not change when layers are added or removed.
uint64_t param_seed(uint64_t seed, std::string_view name);
// Writes the initial values of `spec` (as `dtype`) to dst, numel(spec.shape) elements.
// Normal values: N(0, std), a function of (seed, name, element index) only, so the
// same on every machine and thread count.
void init_param_into(const ParamSpec& spec, double std, uint64_t seed, DType dtype, void* dst);
Tensor init_param(const ParamSpec& spec, double std, uint64_t seed, DType dtype);

}  // namespace tp
