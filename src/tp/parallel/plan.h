#pragma once
// Tensor-parallel plans: which style applies to which module or parameter.
//
// A plan maps a path to a style name. A '*' in a key stands for one path
// segment of digits (a layer index). Lookup precedence for a parameter
// `model.layers.3.mlp.up_proj.weight` of module `model.layers.3.mlp.up_proj`:
//   1. the exact parameter name       model.layers.3.mlp.up_proj.weight
//   2. the exact module name          model.layers.3.mlp.up_proj
//   3. the wildcarded parameter name  model.layers.*.mlp.up_proj.weight
//   4. the wildcarded module name     model.layers.*.mlp.up_proj
// so a per-layer rule beats the generic one.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tp/tensor/shape.h"

namespace tp::parallel {

// Ordered: entries keep the order in which they were written. A type of its
// own, not an alias of std::vector, so that `std::cout << plan` finds the
// operator below by argument-dependent lookup.
struct Plan : std::vector<std::pair<std::string, std::string>> {
  using Entries = std::vector<std::pair<std::string, std::string>>;
  using Entries::Entries;
  Plan() = default;
  Plan(Entries entries) : Entries(std::move(entries)) {}
};

// Prints a plan as a JSON object, in its order.
std::ostream& operator<<(std::ostream& out, const Plan& plan);

// A plan edited by name (an architecture's variant of a base plan): each names
// the entries it touches and fails naming a key the plan lacks, so a base plan
// reordered or renamed cannot be edited in the wrong place without a word.
Plan without_entries(const Plan& plan, const std::vector<std::string>& keys);
Plan with_entries_after(const Plan& plan, const std::string& key, const Plan& entries);

// What the user asks for (Transformers' DistributedConfig).
struct DistributedConfig {
  std::optional<int64_t> tp_size;  // unset: WORLD_SIZE
  // "auto" (the architecture's shipped plan), a JSON object text, or a path to a JSON file
  // whose entries are merged over the shipped plan (the user wins).
  std::string tp_plan = "auto";
  // Megatron-style sequence parallelism: between the blocks, activations are
  // sequence shards (Shard(1) of [B, T, H]; norms and residual adds run on them),
  // an all-gather along the sequence enters each column-parallel block and a
  // reduce-scatter leaves each row-parallel one, in place of the all-reduces.
  bool enable_sequence_parallel = false;
  // Expert parallelism (MoE models): each rank holds num_experts / ep_size experts.
  // Unset or 1: none. With ep_size > 1 every rank of the world is in the ep group
  // (world size = ep_size) and tp_size divides it: ranks r*tp .. r*tp+tp-1 form a
  // tp group. The architecture's base_model_ep_plan applies (its rules own the
  // modules they name: the tp_plan's entries under them are dropped).
  std::optional<int64_t> ep_size;
  // "auto" (the shipped ep plan), a JSON object text, or a path to a JSON file
  // merged over it; a key that matches nothing is an error.
  std::string ep_plan = "auto";
};

// A parameter of the module tree, before any weight is read.
struct ParamRef {
  std::string name;    // full name, e.g. model.layers.0.self_attn.q_proj.weight
  std::string module;  // owning module, e.g. model.layers.0.self_attn.q_proj
  Shape shape;         // global shape
};

struct ResolvedPlan {
  Plan plan;                                      // shipped + user, as merged
  std::map<std::string, std::string> param_style;   // parameter -> style (covered parameters only)
  std::map<std::string, std::string> module_style;  // module -> style whose hooks run around its forward
  bool sequence_parallel = false;                   // the styles run in their sequence-parallel form
  std::vector<std::string> warnings;
};

// "model.layers.12.mlp" -> "model.layers.*.mlp"
std::string wildcard_key(const std::string& path);
// True when `key` (which may contain '*') names `path`.
bool key_matches(const std::string& key, const std::string& path);

// Parses a user plan from JSON text ("{...}") or a JSON file path. Values must be strings.
Plan parse_user_plan(const std::string& spec);
// Entries of `user` replace same-key entries of `shipped`; new keys are appended.
Plan merge_plans(const Plan& shipped, const Plan& user);

// Resolves the plan over the module tree: validates style names (against the
// registry), rejects user keys that match nothing, assigns a style to every
// parameter and module by the precedence above, and collects the warnings
// (shipped rules that matched nothing; parameters no rule covers).
ResolvedPlan resolve_plan(const Plan& shipped, const Plan& user, const std::vector<ParamRef>& params,
                          const std::vector<std::string>& module_names);

}  // namespace tp::parallel
