// Expert-parallel plans from config.json alone (no ranks, no weights): what
// each rank holds, the collectives, and every error Transformers' rules give,
// by message.
#include <gtest/gtest.h>

#include "tp/models/auto.h"
#include "tp/models/plan_report.h"
#include "tp/models/presets.h"

using namespace tp;

namespace {

PlanReport report(const std::string& arch, int64_t tp, int64_t ep, const std::string& ep_plan = "auto") {
  DistributedConfig dc{.tp_size = tp, .ep_size = ep, .ep_plan = ep_plan};
  return make_plan_report(make_preset_config(arch, "tiny"), dc, DType::F32);
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

const PlanParamRow& row(const PlanReport& r, const std::string& name) {
  for (const PlanParamRow& p : r.parameters)
    if (p.name == name) return p;
  throw Error("no parameter " + name);
}

}  // namespace

TEST(MoePlan, TensorParallelCutsEveryExpertAndReducesOnce) {
  PlanReport r = report("mixtral", 2, 1);
  const PlanParamRow& gu = row(r, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(gu.style, "packed_colwise");
  EXPECT_EQ(gu.local_shapes.at(1), (Shape{8, 48, 64}));  // half of every expert's gate and up rows
  EXPECT_EQ(row(r, "model.layers.0.mlp.experts.down_proj").local_shapes.at(0), (Shape{8, 64, 24}));
  EXPECT_EQ(r.experts_per_rank, 8);
  int reduces = 0;
  for (const PlanCollective& c : r.collectives) reduces += c.module == "model.layers.0.mlp.experts" && c.op == "all_reduce";
  EXPECT_EQ(reduces, 1);
}

TEST(MoePlan, ExpertParallelShardsTheExpertDimAndCountsTheAllToAll) {
  PlanReport r = report("qwen3_moe", 2, 4);
  EXPECT_EQ(r.ep_size, 4);
  EXPECT_EQ(r.experts_per_rank, 2);
  ASSERT_EQ(r.total_bytes_per_rank.size(), 4u);
  const PlanParamRow& gu = row(r, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(gu.style, "grouped_gemm");  // the ep rule owns it; the tp plan's packed_colwise is dropped
  for (const Shape& s : gu.local_shapes) EXPECT_EQ(s, (Shape{2, 96, 64}));
  // Attention stays tensor parallel over the tp groups (ranks 0-1, 2-3).
  EXPECT_EQ(row(r, "model.layers.0.self_attn.q_proj.weight").local_shapes.at(3), (Shape{192, 64}));
  int64_t a2a = 0;
  for (const PlanCollective& c : r.collectives)
    if (c.op == "all_to_all") a2a += c.bytes_per_token;
  EXPECT_EQ(a2a, 2 * 2 * (2 * 64 * 4 / 4));  // 2 layers x there and back x top-2 x H x f32 / ep (each rank its chunk)
}

TEST(MoePlan, EveryRuleIsAnErrorByMessage) {
  expect_error([] { report("qwen3_moe", 1, 3); }, "Global number of experts must be divisible by number of devices: 8 % 3 != 0");
  expect_error([] { report("mixtral", 3, 3); }, "num_experts must be divisible by ep_size: 8 % 3 != 0");
  expect_error([] { report("mixtral", 1, 2); }, "All-reduce EP requires `ep_size=tp_size` and identical tokens per EP group.");
  expect_error([] { report("qwen3_moe", 4, 2); }, "`ep_size` must be a multiple of `tp_size` for token dispatch.");
  expect_error([] { report("qwen3_moe", 2, 2, R"({"model.layers.*.mlp.expert": "grouped_gemm"})"); },
               "The `ep_plan` pattern 'model.layers.*.mlp.expert' does not match any module, parameter, or existing "
               "plan entry in qwen3_moe. Check the full path, including any 'model.' prefix.");
  expect_error([] { report("qwen3_moe", 2, 2, R"({"model.layers.*.mlp.experts": "moe_tp_experts"})"); },
               "Invalid expert plan. Must contain either 'ep_dispatch_experts' for all-to-all dispatch or 'ep_router' "
               "and 'moe_tp_experts' for all-reduce masked EP.");
  expect_error([] { report("mixtral", 2, 2, R"({"model.layers.*.self_attn.q_proj": "ep_router"})"); },
               "Router module model.layers.0.self_attn.q_proj is missing `num_experts` and `config.num_experts`");
  expect_error([] { report("qwen3_moe", 2, 2, R"({"model.layers.*.mlp.experts": "ep_dispatch_experts", "model.layers.*.mlp.experts.gate_up_proj": "colwize"})"); },
               "unsupported parallel style(s): colwize");
  expect_error([] { report("llama", 2, 2); }, "model_type 'llama' has no experts to split");
  expect_error([] { report("qwen3_moe", 1, 0); }, "Parallelism sizes must be >= 1: ep_size is 0");
  expect_error([] { resolve_tp_size(DistributedConfig{.ep_size = 2}, 4); },
               "ep_size 2 does not match the number of processes (4)");
}

TEST(MoeConfigErrors, NameTheKey) {
  ModelConfig c = make_preset_config("qwen3_moe", "tiny");
  c.raw["num_experts_per_tok"] = 9;
  expect_error([&] { AutoModelForCausalLM::from_config(c); }, "'num_experts_per_tok' (9) is more than the 8 experts");
  c.raw.erase("num_experts");
  expect_error([&] { AutoModelForCausalLM::from_config(c); }, "'num_experts' must be a positive integer for model_type qwen3_moe");
}
