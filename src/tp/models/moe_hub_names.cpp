#include "tp/models/moe_hub_names.h"

#include <fmt/format.h>

#include <cctype>

namespace tp {


const HubNaming kNamings[2] = {{"block_sparse_moe", "w1", "w3", "w2"}, {"mlp", "gate_proj", "up_proj", "down_proj"}};

std::string layer_prefix(const std::string& name) {
  const std::string head = "model.layers.";
  if (!name.starts_with(head)) return {};
  size_t i = head.size();
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == head.size() || i >= name.size() || name[i] != '.') return {};
  return name.substr(0, i + 1);
}

std::string expert_key(const std::string& layer, const HubNaming& n, int64_t e, const char* proj) {
  return fmt::format("{}{}.experts.{}.{}.weight", layer, n.block, e, proj);
}


std::optional<FusedLocation> fused_location(const std::string& hub_name, int64_t param_rows) {
  const std::string layer = layer_prefix(hub_name);
  if (layer.empty()) return std::nullopt;
  const std::string rest = hub_name.substr(layer.size());
  if (rest == "block_sparse_moe.gate.weight") return FusedLocation{layer + "mlp.gate.weight"};
  for (const HubNaming& n : kNamings) {
    const std::string head = std::string(n.block) + ".experts.";
    if (!rest.starts_with(head)) continue;
    size_t i = head.size(), digits = 0;
    int64_t e = 0;
    for (; i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i])) && digits < 9; ++i, ++digits)
      e = e * 10 + (rest[i] - '0');
    if (digits == 0 || i >= rest.size() || rest[i] != '.') continue;
    const std::string proj = rest.substr(i + 1);
    const std::string fused = layer + "mlp.experts.";
    if (proj == std::string(n.gate) + ".weight") return FusedLocation{fused + "gate_up_proj", e, 0, param_rows / 2};
    if (proj == std::string(n.up) + ".weight")
      return FusedLocation{fused + "gate_up_proj", e, param_rows / 2, param_rows / 2};
    if (proj == std::string(n.down) + ".weight") return FusedLocation{fused + "down_proj", e, 0, 0};
  }
  return std::nullopt;
}

}  // namespace tp
