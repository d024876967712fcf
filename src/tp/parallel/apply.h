#pragma once
// Applies a resolved plan to a module tree before any weight is read: asks each
// parameter's style to validate it and decide this rank's slice, and installs
// the module hooks. No communication and no I/O, so `tp plan` runs it for every
// rank of a tp group from one process.
#include <map>
#include <memory>
#include <string>

#include "tp/nn/module.h"
#include "tp/parallel/plan.h"

namespace tp::parallel {

// Instances that replace the registry's style for one module (by full name),
// e.g. a KV-head-replicating colwise for k_proj when tp_size > num_key_value_heads.
using StyleOverrides = std::map<std::string, std::shared_ptr<const nn::TensorParallelLayer>>;

// `mesh` may be null for a dry run (hooks are then not installed).
void apply_plan(nn::Module& root, const ResolvedPlan& plan, const nn::TpRank& tp, const dist::DeviceMesh* mesh,
                const StyleOverrides& overrides = {});

// The style instance that serves `module_name` with plan style `style_name`.
const nn::TensorParallelLayer& style_for(const std::string& module_name, const std::string& style_name,
                                     const StyleOverrides& overrides);

}  // namespace tp::parallel
