#pragma once
// The style registry: name -> configured instance, like Transformers'
// ALL_PARALLEL_STYLES. Users add their own with register_style.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tp/parallel/layer.h"

namespace tp::parallel {

using StyleRegistry = std::map<std::string, std::shared_ptr<const TensorParallelLayer>>;

// Every registered style (the shipped ones are registered on first use).
const StyleRegistry& parallel_styles();
// Adds or replaces a style; `name` must be non-empty.
void register_style(const std::string& name, std::shared_ptr<const TensorParallelLayer> style);
// nullptr when unknown.
const TensorParallelLayer* find_style(const std::string& name);
// Throws naming the style and listing every supported name.
const TensorParallelLayer& get_style(const std::string& name);
std::vector<std::string> style_names();

}  // namespace tp::parallel
