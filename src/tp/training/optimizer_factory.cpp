#include "tp/training/optimizer_factory.h"

#include <map>
#include <sstream>

#include "tp/core/error.h"

namespace tp::training {
namespace {

// "momentum=0.9,weight_decay=..." (Transformers' optim_args) -> key -> value.
std::map<std::string, double> parse_optim_args(const std::string& text) {
  std::map<std::string, double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    const size_t eq = item.find('=');
    TP_CHECK(eq != std::string::npos, "optim_args item '{}' is not key=value", item);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    try {
      out[key] = std::stod(value);
    } catch (const std::exception&) {
      fail("optim_args: '{}' is not a number (in '{}')", value, item);
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const TrainingArguments& a, ModelParameters& params) {
  std::map<std::string, double> extra = parse_optim_args(a.optim_args);
  if (a.optim == "sgd") {
    SGDOptions o{.momentum = 0, .weight_decay = a.weight_decay};
    for (const auto& [k, v] : extra) {
      TP_CHECK(k == "momentum", "optim_args '{}' is not supported by sgd; supported: momentum", k);
      o.momentum = v;
    }
    return std::make_unique<SGD>(params, o);
  }
  TP_CHECK(extra.empty(), "optim_args are not used by {} (set adam_beta1, adam_beta2, adam_epsilon instead)", a.optim);
  return std::make_unique<AdamW>(params, AdamWOptions{a.adam_beta1, a.adam_beta2, a.adam_epsilon, a.weight_decay});
}

}  // namespace tp::training
