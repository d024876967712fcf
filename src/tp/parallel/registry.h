#pragma once
// The style registry: name -> configured instance, like Transformers'
// ALL_PARALLEL_STYLES. Users add their own with register_style.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

using StyleRegistry = std::map<std::string, std::shared_ptr<const nn::TensorParallelLayer>>;

// Every registered style (the shipped ones are registered on first use).
const StyleRegistry& parallel_styles();
// Adds or replaces a style; `name` must be non-empty.
void register_style(const std::string& name, std::shared_ptr<const nn::TensorParallelLayer> style);
// nullptr when unknown.
const nn::TensorParallelLayer* find_style(const std::string& name);
// Throws naming the style and listing every supported name.
const nn::TensorParallelLayer& get_style(const std::string& name);
std::vector<std::string> style_names();

}  // namespace tp::parallel
