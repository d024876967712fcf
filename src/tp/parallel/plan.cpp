#include "tp/parallel/plan.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tp/parallel/registry.h"
#include "tp/core/error.h"

namespace tp::parallel {

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '.')) parts.push_back(part);
  return parts;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Collapses names that differ only in layer indices: one line per pattern.
std::vector<std::string> compress(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& n : names)
    if (seen.insert(wildcard_key(n)).second) out.push_back(wildcard_key(n));
  return out;
}

}  // namespace

std::string wildcard_key(const std::string& path) {
  std::vector<std::string> parts = split_path(path);
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "." : "") + (all_digits(parts[i]) ? std::string("*") : parts[i]);
  return out;
}

bool key_matches(const std::string& key, const std::string& path) {
  std::vector<std::string> k = split_path(key), p = split_path(path);
  if (k.size() != p.size()) return false;
  for (size_t i = 0; i < k.size(); ++i)
    if (!(k[i] == p[i] || (k[i] == "*" && all_digits(p[i])))) return false;
  return true;
}

Plan parse_user_plan(const std::string& spec) {
  std::string text = spec, source = "tp_plan";
  bool looks_like_json = spec.find_first_not_of(" \t\r\n") != std::string::npos &&
                         spec[spec.find_first_not_of(" \t\r\n")] == '{';
  if (!looks_like_json) {
    std::ifstream f(spec);
    TP_CHECK(f.good(), "tp_plan '{}' is neither \"auto\", a JSON object, nor a readable file", spec);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
    source = spec;
  }
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
  TP_CHECK(j.is_object(), "{}: a tp_plan must be a JSON object mapping module/parameter paths to style names, got {}",
           source, j.type_name());
  Plan plan;
  for (auto& [key, value] : j.items()) {
    TP_CHECK(value.is_string(), "{}: the style for '{}' must be a string (a style name), got {}", source, key,
             value.dump());
    plan.emplace_back(key, value.get<std::string>());
  }
  return plan;
}

namespace {

Plan::const_iterator find_key(const Plan& plan, const std::string& key, const char* edit) {
  auto it = std::find_if(plan.begin(), plan.end(), [&](const auto& e) { return e.first == key; });
  if (it == plan.end()) {
    std::vector<std::string> keys;
    for (const auto& e : plan) keys.push_back(e.first);
    fail("{}: the plan has no entry '{}'; its keys: {}", edit, key, fmt::join(keys, ", "));
  }
  return it;
}

}  // namespace

Plan without_entries(const Plan& plan, const std::vector<std::string>& keys) {
  for (const std::string& key : keys) (void)find_key(plan, key, "without_entries");
  Plan out;
  for (const auto& e : plan)
    if (std::find(keys.begin(), keys.end(), e.first) == keys.end()) out.push_back(e);
  return out;
}

Plan with_entries_after(const Plan& plan, const std::string& key, const Plan& entries) {
  const auto at = find_key(plan, key, "with_entries_after") + 1;
  Plan out(Plan::Entries(plan.begin(), at));
  out.insert(out.end(), entries.begin(), entries.end());
  out.insert(out.end(), at, plan.end());
  return out;
}

Plan merge_plans(const Plan& shipped, const Plan& user) {
  Plan merged = shipped;
  for (const auto& [key, style] : user) {
    auto it = std::find_if(merged.begin(), merged.end(), [&](const auto& e) { return e.first == key; });
    if (it != merged.end()) {
      it->second = style;
    } else {
      merged.emplace_back(key, style);
    }
  }
  return merged;
}

ResolvedPlan resolve_plan(const Plan& shipped, const Plan& user, const std::vector<ParamRef>& params,
                          const std::vector<std::string>& module_names) {
  ResolvedPlan r;
  r.plan = merge_plans(shipped, user);

  // Unknown styles: one error naming all of them and every supported name.
  std::set<std::string> unknown;
  for (const auto& [key, style] : r.plan)
    if (!find_style(style)) unknown.insert(style);
  if (!unknown.empty()) {
    std::vector<std::string> bad(unknown.begin(), unknown.end());
    fail("unsupported parallel style(s): {}; supported styles are: {}", fmt::join(bad, ", "),
         fmt::join(style_names(), ", "));
  }

  auto matches_anything = [&](const std::string& key) {
    for (const auto& p : params)
      if (key_matches(key, p.name)) return true;
    for (const auto& m : module_names)
      if (key_matches(key, m)) return true;
    return false;
  };
  for (const auto& [key, style] : user) {
    bool in_shipped = std::any_of(shipped.begin(), shipped.end(), [&](const auto& e) { return e.first == key; });
    TP_CHECK(in_shipped || matches_anything(key),
             "tp_plan key '{}' (style '{}') does not match any module, parameter, or existing plan entry of this "
             "model; check the full path, including any 'model.' prefix (e.g. 'model.layers.*.mlp.up_proj')",
             key, style);
  }

  std::map<std::string, std::string> exact, wild;
  for (const auto& [key, style] : r.plan) (key.find('*') == std::string::npos ? exact : wild)[key] = style;
  auto lookup = [&](const std::string& path, bool exact_only) -> const std::string* {
    if (auto it = exact.find(path); it != exact.end()) return &it->second;
    if (exact_only) return nullptr;
    if (auto it = wild.find(wildcard_key(path)); it != wild.end()) return &it->second;
    return nullptr;
  };

  std::set<std::string> used;
  auto mark = [&](const std::string& path) {
    if (exact.count(path)) used.insert(path);
    else used.insert(wildcard_key(path));
  };
  for (const auto& m : module_names) {
    if (const std::string* s = lookup(m, false)) {
      r.module_style[m] = *s;
      mark(m);
    }
  }
  std::vector<std::string> uncovered;
  for (const auto& p : params) {
    const std::string* s = nullptr;
    std::string via;
    if ((s = lookup(p.name, true))) via = p.name;
    else if ((s = lookup(p.module, true))) via = p.module;
    else if ((s = lookup(p.name, false))) via = p.name;
    else if ((s = lookup(p.module, false))) via = p.module;
    if (s) {
      r.param_style[p.name] = *s;
      mark(via);
    } else {
      uncovered.push_back(p.name);
    }
  }
  std::vector<std::string> unused;
  for (const auto& [key, style] : r.plan)
    if (!used.count(key)) unused.push_back(key);
  if (!unused.empty())
    r.warnings.push_back(fmt::format("The following TP rules were not applied on any of the layers: {}",
                                     fmt::join(unused, ", ")));
  if (!uncovered.empty())
    r.warnings.push_back(fmt::format("The following parameters were not sharded (replicated on every rank): {}",
                                     fmt::join(compress(uncovered), ", ")));
  return r;
}

std::ostream& operator<<(std::ostream& out, const Plan& plan) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [key, style] : plan) j[key] = style;
  return out << j.dump(2);
}

}  // namespace tp::parallel
