#pragma once
// What a plan does at a given tp_size, computed from config.json alone (the
// module tree without weights, the load-time hooks asked for every rank).
#include <nlohmann/json.hpp>

#include <iosfwd>
#include <string>
#include <vector>

#include "tp/models/auto.h"

namespace tp {

struct PlanParamRow {
  std::string name;
  std::string style;                   // "" when replicated by default
  std::string tied_to;                 // shares this tensor's slice (no bytes of its own)
  std::string quantized;               // "gptq 4-bit g128" when the checkpoint holds it packed, else ""
                                       // (its bytes then: codes, f16 scales, zeros as ops::QuantizedLinear holds them)
  Shape global_shape;
  std::vector<Shape> local_shapes;     // one per rank
  std::vector<int64_t> bytes_per_rank;  // one per rank (the world's ranks with ep_size > 1)
};

struct PlanCollective {
  std::string module;
  std::string op;
  int64_t bytes_per_token;
};

struct PlanReport {
  int64_t tp_size = 1;
  int64_t ep_size = 1;
  int64_t num_experts = 0;       // per MoE layer (0: a dense model)
  int64_t experts_per_rank = 0;  // on rank 0
  bool sequence_parallel = false;
  DType dtype = DType::F32;
  std::vector<PlanParamRow> parameters;
  std::vector<PlanCollective> collectives;
  std::vector<int64_t> total_bytes_per_rank;
  int64_t total_bytes_unsharded = 0;
  std::vector<std::string> warnings;
};

// Errors (unknown style, indivisible size, ...) are thrown as when loading.
PlanReport make_plan_report(const ModelConfig& config, const DistributedConfig& dc, DType dtype);
nlohmann::ordered_json plan_report_json(const PlanReport& report);
void print_plan_report(std::ostream& out, const PlanReport& report);

}  // namespace tp
