#include "tp/models/plan_report.h"

#include <fmt/ostream.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <set>

#include "tp/models/config_check.h"
#include "tp/models/mxfp4.h"
#include "tp/models/quantized_checkpoint.h"
#include "tp/models/quantized_experts.h"
#include "tp/nn/layers.h"
#include "tp/nn/moe.h"
#include "tp/ops/quantized_linear.h"
#include "tp/parallel/apply.h"

namespace tp {

namespace {

int64_t param_bytes(const Shape& shape, DType matrix_dtype) {
  // As the loader stores them: matrices in the chosen dtype, vectors in f32.
  return numel(shape) * static_cast<int64_t>(dtype_size(shape.size() >= 2 ? matrix_dtype : DType::F32));
}

std::string human_bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / double(int64_t{1} << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / double(1 << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", b);
}

// A quantized checkpoint's format as the report shows it.
std::string quantized_format(const QuantizationConfig& q) {
  return fmt::format("{} {}-bit {}{}", q.method, q.bits,
                     q.group_size > 0 ? fmt::format("g{}", q.group_size) : "per-channel",
                     q.method == "gptq" && q.desc_act ? " act-order" : "");
}

// A quantized checkpoint's Linear weights by name, with their format as the report shows it.
std::map<std::string, std::string> quantized_weights(CausalLM& model, const ModelConfig& config) {
  std::map<std::string, std::string> out;
  const std::optional<QuantizationConfig>& q = config.quantization;
  if (!q || !q->packs_linears()) return out;
  for (const nn::Module* m : model.modules())
    if (const auto* linear = dynamic_cast<const nn::Linear*>(m); linear && q->quantizes(m->name()))
      out[linear->weight.name] = quantized_format(*q);
  return out;
}


}  // namespace

PlanReport make_plan_report(const ModelConfig& config, const DistributedConfig& dc, DType dtype) {
  std::unique_ptr<CausalLM> model = AutoModelForCausalLM::from_config(config);
  const int64_t tp = dc.tp_size.value_or(1), ep = dc.ep_size.value_or(1);
  TP_CHECK(tp >= 1, "tp_size must be >= 1, got {}", tp);
  TP_CHECK(ep >= 1, "Parallelism sizes must be >= 1: ep_size is {}", ep);
  // With expert parallelism every rank of the world (ep_size of them) is in the ep
  // group, and rank r is rank r % tp of its tp group (make_model_mesh).
  const int64_t ranks = ep > 1 ? ep : tp;
  parallel::StyleOverrides overrides;
  parallel::ResolvedPlan resolved = resolve_model_plan(*model, dc, tp, &overrides);
  std::map<std::string, std::string> tied = model->tied_parameters();
  const std::map<std::string, std::string> quantized = quantized_weights(*model, config);
  // GPT-OSS's MXFP4 experts, which inference keeps packed where a rank's slice holds whole blocks.
  std::set<std::string> mxfp4_experts;
  // A quantized checkpoint's per-expert Linears, which inference keeps packed: the fused parameters' experts.
  std::map<std::string, const nn::MoeExperts*> quantized_experts;
  for (nn::Module* m : model->modules())
    if (const auto* experts = dynamic_cast<const nn::MoeExperts*>(m); experts && config.quantization) {
      if (config.quantization->method == "mxfp4" && experts->layout().gpt_oss)
        mxfp4_experts.insert({experts->gate_up_proj.name, experts->down_proj.name});
      if (quantizes_experts(*config.quantization, model->checkpoint_names().experts, *experts))
        quantized_experts[experts->gate_up_proj.name] = quantized_experts[experts->down_proj.name] = experts;
    }
  // Unsharded: every expert whole (the shards as tp 1 has them, before the plan is applied).
  std::map<std::string, int64_t> unsharded_expert_bytes;
  for (const auto& [name, experts] : quantized_experts) {
    const QuantizedExpertBytes b = quantized_experts_bytes(*config.quantization, *experts);
    unsharded_expert_bytes[name] = name == experts->down_proj.name ? b.down : b.gate_up;
  }

  PlanReport r;
  r.tp_size = tp;
  r.ep_size = ep;
  r.sequence_parallel = resolved.sequence_parallel;
  r.dtype = dtype;
  r.warnings = resolved.warnings;
  r.total_bytes_per_rank.assign(static_cast<size_t>(ranks), 0);
  std::vector<nn::Parameter*> params = model->parameters();
  // A row per parameter and rank: bound what a huge tp_size would make us hold.
  constexpr int64_t kBytesPerRow = 256;
  TP_CHECK(ranks <= physical_memory_bytes() / 2 / kBytesPerRow / static_cast<int64_t>(params.size()),
           "{} ranks: the report would hold {} x {} parameter rows, more than this machine's memory", ranks, ranks,
           params.size());
  r.parameters.resize(params.size());
  for (int64_t rank = 0; rank < ranks; ++rank) {
    parallel::apply_plan(*model, resolved, {tp, rank % tp, ep, ep > 1 ? rank : 0}, nullptr, overrides);
    if (rank == 0)
      for (nn::Module* m : model->modules())
        if (const auto* experts = dynamic_cast<const nn::MoeExperts*>(m)) {
          r.num_experts = experts->num_experts();
          r.experts_per_rank = experts->num_local_experts();
        }
    std::map<std::string, const nn::Parameter*> by_name;
    for (const nn::Parameter* p : params) by_name[p->name] = p;
    for (size_t i = 0; i < params.size(); ++i) {
      const nn::Parameter& p = *params[i];
      PlanParamRow& row = r.parameters[i];
      row.name = p.name;
      row.global_shape = p.global_shape;
      if (auto it = resolved.param_style.find(p.name); it != resolved.param_style.end()) row.style = it->second;
      Shape local = nn::local_shape(p);
      int64_t bytes = param_bytes(local, dtype);
      if (auto qw = quantized.find(p.name); qw != quantized.end()) {
        row.quantized = qw->second;
        bytes = quantized_slice_bytes(*config.quantization, p.global_shape, local);
      } else if (mxfp4_experts.count(p.name) && mxfp4_packs(p.shard)) {  // kept packed at inference
        row.quantized = "mxfp4";
        bytes = mxfp4_packed_bytes(local);
      } else if (auto qe = quantized_experts.find(p.name); qe != quantized_experts.end()) {
        const QuantizedExpertBytes b = quantized_experts_bytes(*config.quantization, *qe->second);
        row.quantized = quantized_format(*config.quantization);
        bytes = p.name == qe->second->down_proj.name ? b.down : b.gate_up;
      }
      if (auto t = tied.find(p.name); t != tied.end() && by_name.count(t->second)) {
        const nn::Parameter& src = *by_name[t->second];
        if (nn::local_shape(src) == local && src.shard.spans.size() == p.shard.spans.size()) {
          row.tied_to = t->second;
          bytes = 0;
        }
      }
      row.local_shapes.push_back(local);
      row.bytes_per_rank.push_back(bytes);
      r.total_bytes_per_rank[rank] += bytes;
      if (rank == 0 && row.tied_to.empty())
        r.total_bytes_unsharded += mxfp4_experts.count(p.name)      ? mxfp4_packed_bytes(p.global_shape)
                                   : quantized_experts.count(p.name) ? unsharded_expert_bytes.at(p.name)
                                   : row.quantized.empty()           ? param_bytes(p.global_shape, dtype)
                                                                     : quantized_slice_bytes(*config.quantization,
                                                                                       p.global_shape, p.global_shape);
    }
  }
  for (nn::Module* m : model->modules()) {
    auto it = resolved.module_style.find(m->name());
    if (it == resolved.module_style.end()) continue;
    const nn::TensorParallelLayer& style = parallel::style_for(m->name(), it->second, overrides);
    for (const nn::CollectiveCost& c : style.forward_collectives(*m, {tp, 0, ep, 0}))
      r.collectives.push_back({m->name(), c.op, c.bytes_per_token});
  }
  return r;
}

nlohmann::ordered_json plan_report_json(const PlanReport& r) {
  nlohmann::ordered_json j;
  j["tp_size"] = r.tp_size;
  j["ep_size"] = r.ep_size;
  if (r.num_experts > 0) {
    j["num_experts"] = r.num_experts;
    j["experts_per_rank"] = r.experts_per_rank;
  }
  j["sequence_parallel"] = r.sequence_parallel;
  j["dtype"] = dtype_name(r.dtype);
  j["parameters"] = nlohmann::ordered_json::array();
  for (const PlanParamRow& p : r.parameters) {
    nlohmann::ordered_json e;
    e["name"] = p.name;
    e["style"] = p.style.empty() ? "replicated" : p.style;
    if (!p.tied_to.empty()) e["tied_to"] = p.tied_to;
    if (!p.quantized.empty()) e["quantized"] = p.quantized;
    e["global_shape"] = p.global_shape;
    e["local_shapes"] = p.local_shapes;
    e["bytes_per_rank"] = p.bytes_per_rank;
    j["parameters"].push_back(e);
  }
  j["collectives"] = nlohmann::ordered_json::array();
  for (const PlanCollective& c : r.collectives)
    j["collectives"].push_back({{"module", c.module}, {"op", c.op}, {"bytes_per_token", c.bytes_per_token}});
  j["total_bytes_per_rank"] = r.total_bytes_per_rank;
  j["total_bytes_unsharded"] = r.total_bytes_unsharded;
  j["warnings"] = r.warnings;
  return j;
}

void print_plan_report(std::ostream& out, const PlanReport& r) {
  fmt::print(out, "tp_size {}{}{} · weights {} · {} parameters\n", r.tp_size,
             r.ep_size > 1 ? fmt::format(" · ep_size {}", r.ep_size) : "",
             r.sequence_parallel ? " · sequence parallel" : "", dtype_name(r.dtype), r.parameters.size());
  if (r.num_experts > 0)
    fmt::print(out, "experts per layer: {} · per rank: {}\n", r.num_experts, r.experts_per_rank);
  fmt::print(out, "\n");
  auto style_of = [](const PlanParamRow& p) {
    std::string style = p.style.empty() ? "(replicated)" : p.style;
    if (!p.tied_to.empty()) style += " (tied)";
    if (!p.quantized.empty()) style += ", " + p.quantized;
    return style;
  };
  size_t width = 30;
  for (const PlanParamRow& p : r.parameters) width = std::max(width, style_of(p).size() + 1);
  fmt::print(out, "{:<52} {:<{}} {:<16} {:<16} {:>12}\n", "parameter", "style", width, "global", "rank 0", "bytes/rank");
  for (const PlanParamRow& p : r.parameters)
    fmt::print(out, "{:<52} {:<{}} {:<16} {:<16} {:>12}\n", p.name, style_of(p), width, shape_str(p.global_shape),
               shape_str(p.local_shapes.at(0)), human_bytes(p.bytes_per_rank.at(0)));
  int64_t per_token = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> by_op;  // op -> (count, bytes per token)
  for (const PlanCollective& c : r.collectives) {
    per_token += c.bytes_per_token;
    by_op[c.op].first += 1;
    by_op[c.op].second += c.bytes_per_token;
  }
  fmt::print(out, "\ncollectives per forward: ");
  for (const auto& [op, n] : by_op) fmt::print(out, "{} x {} ({} per token)  ", n.first, op, human_bytes(n.second));
  fmt::print(out, "({} per token in all)\n", human_bytes(per_token));
  fmt::print(out, "weights per rank: ");
  for (size_t i = 0; i < r.total_bytes_per_rank.size(); ++i)
    fmt::print(out, "{}rank {}: {}", i ? ", " : "", i, human_bytes(r.total_bytes_per_rank[i]));
  fmt::print(out, "  (unsharded: {})\n", human_bytes(r.total_bytes_unsharded));
}

}  // namespace tp
