// Plan resolution and its diagnostics, in one process: nothing here reads a
// weight or starts a rank (the plan is checked from config.json alone).
#include <gtest/gtest.h>

#include "tp/models/auto.h"
#include "tp/models/plan_report.h"
#include "tp/models/presets.h"
#include "tp/parallel/plan.h"
#include "tp/parallel/registry.h"

using namespace tp;
using parallel::Plan;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<parallel::ParamRef> toy_params() {
  return {{"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj", {8, 4}},
          {"model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj", {8, 4}},
          {"model.layers.1.mlp.up_proj.bias", "model.layers.1.mlp.up_proj", {8}},
          {"model.norm.weight", "model.norm", {4}}};
}
std::vector<std::string> toy_modules() {
  return {"model", "model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj", "model.norm"};
}

ModelConfig preset(const std::string& arch, const std::string& name, int64_t layers = 2) {
  ModelConfig c = make_preset_config(arch, name);
  c.num_hidden_layers = layers;
  return c;
}

// A small Llama whose every size splits over 1..4 ranks, so each test below breaks exactly one.
ModelConfig splittable_llama() {
  ModelConfig c = preset("llama", "tiny");
  c.num_attention_heads = 12;
  c.num_key_value_heads = 12;
  c.head_dim = 16;
  c.intermediate_size = 384;
  c.vocab_size = 516;
  return c;
}

const PlanParamRow& row(const PlanReport& r, const std::string& name) {
  for (const auto& p : r.parameters)
    if (p.name == name) return p;
  throw Error("no parameter " + name);
}

}  // namespace

TEST(Plan, WildcardsMatchOneDigitSegment) {
  EXPECT_EQ(parallel::wildcard_key("model.layers.12.mlp"), "model.layers.*.mlp");
  EXPECT_TRUE(parallel::key_matches("model.layers.*.mlp", "model.layers.3.mlp"));
  EXPECT_FALSE(parallel::key_matches("model.layers.*.mlp", "model.layers.x.mlp"));
  EXPECT_FALSE(parallel::key_matches("model.layers.*", "model.layers.3.mlp"));
}

TEST(Plan, PrecedenceExactParamThenModuleThenWildcards) {
  Plan shipped = {{"model.layers.*.mlp.up_proj", "colwise"}};
  // Wildcarded module rule alone.
  auto r = parallel::resolve_plan(shipped, {}, toy_params(), toy_modules());
  EXPECT_EQ(r.param_style.at("model.layers.0.mlp.up_proj.weight"), "colwise");
  // A wildcarded parameter rule beats the wildcarded module rule.
  r = parallel::resolve_plan(shipped, {{"model.layers.*.mlp.up_proj.weight", "rowwise"}}, toy_params(), toy_modules());
  EXPECT_EQ(r.param_style.at("model.layers.0.mlp.up_proj.weight"), "rowwise");
  EXPECT_EQ(r.param_style.at("model.layers.1.mlp.up_proj.bias"), "colwise");
  // An exact module rule (one layer) beats both wildcarded rules.
  r = parallel::resolve_plan(shipped,
                             {{"model.layers.*.mlp.up_proj.weight", "rowwise"},
                              {"model.layers.1.mlp.up_proj", "packed_colwise"}},
                             toy_params(), toy_modules());
  EXPECT_EQ(r.param_style.at("model.layers.1.mlp.up_proj.weight"), "packed_colwise");
  EXPECT_EQ(r.param_style.at("model.layers.0.mlp.up_proj.weight"), "rowwise");
  EXPECT_EQ(r.module_style.at("model.layers.1.mlp.up_proj"), "packed_colwise");
  EXPECT_EQ(r.module_style.at("model.layers.0.mlp.up_proj"), "colwise");
  // The exact parameter name beats everything.
  r = parallel::resolve_plan(shipped,
                             {{"model.layers.1.mlp.up_proj", "packed_colwise"},
                              {"model.layers.1.mlp.up_proj.weight", "local_params"}},
                             toy_params(), toy_modules());
  EXPECT_EQ(r.param_style.at("model.layers.1.mlp.up_proj.weight"), "local_params");
}

// An architecture's variant edits its base plan by name: the edits keep the
// order, and a key the plan lacks is an error naming it and the plan's keys.
TEST(Plan, EditedByNameKeepsTheOrderAndRefusesAMissingKey) {
  const Plan base = {{"a", "colwise"}, {"b", "colwise"}, {"c", "rowwise"}, {"d", "colwise"}};
  EXPECT_EQ(parallel::without_entries(base, {"d", "b"}), (Plan{{"a", "colwise"}, {"c", "rowwise"}}));
  EXPECT_EQ(parallel::with_entries_after(base, "b", {{"x", "local"}, {"y", "local"}}),
            (Plan{{"a", "colwise"}, {"b", "colwise"}, {"x", "local"}, {"y", "local"}, {"c", "rowwise"},
                  {"d", "colwise"}}));
  EXPECT_EQ(parallel::with_entries_after(base, "d", {{"x", "local"}}).back(), (std::pair<std::string, std::string>{
                                                                                   "x", "local"}));
  EXPECT_EQ(error_of([&] { parallel::without_entries(base, {"a", "mlp"}); }),
            "without_entries: the plan has no entry 'mlp'; its keys: a, b, c, d");
  EXPECT_EQ(error_of([&] { parallel::with_entries_after(base, "e", {}); }),
            "with_entries_after: the plan has no entry 'e'; its keys: a, b, c, d");
}

TEST(Plan, UserPlanMergesOverShippedAndUserWins) {
  Plan merged = parallel::merge_plans({{"a", "colwise"}, {"b", "rowwise"}}, {{"b", "colwise"}, {"c", "rowwise"}});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[1].second, "colwise");
  EXPECT_EQ(merged[2].first, "c");
}

TEST(Plan, UnknownStyleListsBadNamesAndEverySupportedName) {
  std::string msg = error_of([] {
    parallel::resolve_plan({{"model.layers.*.mlp.up_proj", "colwize"}}, {{"model.norm", "rowwize"}}, toy_params(),
                           toy_modules());
  });
  EXPECT_NE(msg.find("colwize"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rowwize"), std::string::npos) << msg;
  for (const std::string& name : parallel::style_names()) EXPECT_NE(msg.find(name), std::string::npos) << name;
}

TEST(Plan, UserKeyMatchingNothingIsAnErrorWithAHint) {
  std::string msg = error_of([] {
    parallel::resolve_plan({}, {{"layers.*.mlp.up_proj", "colwise"}}, toy_params(), toy_modules());
  });
  EXPECT_NE(msg.find("layers.*.mlp.up_proj"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.'"), std::string::npos) << msg;
}

TEST(Plan, WarnsAboutShippedRulesMatchingNothingAndUncoveredParameters) {
  auto r = parallel::resolve_plan({{"model.layers.*.mlp.up_proj", "colwise"}, {"model.layers.*.mlp.gate_proj", "colwise"}},
                                  {}, toy_params(), toy_modules());
  ASSERT_EQ(r.warnings.size(), 2u);
  EXPECT_NE(r.warnings[0].find("model.layers.*.mlp.gate_proj"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[1].find("model.norm.weight"), std::string::npos) << r.warnings[1];
  EXPECT_EQ(r.warnings[1].find("up_proj"), std::string::npos) << r.warnings[1];
}

TEST(Plan, UserPlanFromJsonTextOrFile) {
  Plan p = parallel::parse_user_plan(R"({"model.layers.*.mlp.up_proj": "rowwise", "lm_head": "colwise"})");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].first, "model.layers.*.mlp.up_proj");
  EXPECT_NE(error_of([] { parallel::parse_user_plan(R"({"a": 3})"); }).find("'a'"), std::string::npos);
  EXPECT_NE(error_of([] { parallel::parse_user_plan("/nonexistent/plan.json"); }).find("/nonexistent/plan.json"),
            std::string::npos);
  EXPECT_NE(error_of([] { parallel::parse_user_plan("{bad json"); }).find("JSON"), std::string::npos);
}

TEST(Plan, ModelShipsTransformersPlanAndTiedEmbeddingsAreVocabParallel) {
  auto model = AutoModelForCausalLM::from_config(preset("qwen3", "tiny"));
  Plan plan = model->shipped_plan();
  auto style = [&](const std::string& key) {
    for (const auto& [k, s] : plan)
      if (k == key) return s;
    return std::string();
  };
  EXPECT_EQ(style("model.layers.*.self_attn.q_proj"), "colwise");
  EXPECT_EQ(style("model.layers.*.self_attn.o_proj"), "rowwise");
  EXPECT_EQ(style("model.layers.*.self_attn.q_norm"), "replicated_with_grad_allreduce");
  EXPECT_EQ(style("model.layers.*.mlp.down_proj"), "rowwise");
  EXPECT_EQ(style("lm_head"), "colwise_gather_output");
  EXPECT_EQ(style("model.embed_tokens"), "embedding_rowwise");  // tie_word_embeddings
}

TEST(Plan, IndivisibleSizesFailBeforeAnyWeightIsRead) {
  ModelConfig c = splittable_llama();
  c.num_attention_heads = 10;
  c.num_key_value_heads = 10;
  c.head_dim = 16;
  std::string msg = error_of([&] { make_plan_report(c, {.tp_size = 4}, DType::F32); });
  EXPECT_NE(msg.find("num_attention_heads 10"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tp_size 4"), std::string::npos) << msg;

  EXPECT_NO_THROW(make_plan_report(splittable_llama(), {.tp_size = 4}, DType::F32));
  c = splittable_llama();
  c.intermediate_size = 390;  // not divisible by 4
  msg = error_of([&] { make_plan_report(c, {.tp_size = 4}, DType::F32); });
  EXPECT_NE(msg.find("intermediate_size 390"), std::string::npos) << msg;

  c = splittable_llama();
  c.vocab_size = 514;  // lm_head colwise_gather_output
  msg = error_of([&] { make_plan_report(c, {.tp_size = 4}, DType::F32); });
  EXPECT_NE(msg.find("lm_head"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(514)"), std::string::npos) << msg;

  c = splittable_llama();
  c.num_key_value_heads = 3;  // 3 kv heads: neither divides nor is divided by 2 in a way that splits
  c.head_dim = 16;
  msg = error_of([&] { make_plan_report(c, {.tp_size = 2}, DType::F32); });
  EXPECT_NE(msg.find("num_key_value_heads 3"), std::string::npos) << msg;
}

TEST(Plan, KvHeadsAreReplicatedWhenTpIsAMultipleOfThem) {
  ModelConfig c = splittable_llama();
  c.num_key_value_heads = 2;
  PlanReport r = make_plan_report(c, {.tp_size = 4}, DType::F32);
  const auto& k = row(r, "model.layers.0.self_attn.k_proj.weight");
  ASSERT_EQ(k.local_shapes.size(), 4u);
  for (const Shape& s : k.local_shapes) EXPECT_EQ(s, (Shape{16, c.hidden_size}));  // one whole head per rank
  const auto& q = row(r, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.local_shapes[0], (Shape{48, c.hidden_size}));  // 3 of the 12 query heads
}

TEST(Plan, Qwen3_0_6B_AtTp4HoldsAQuarterOfTheShardedBytes) {
  ModelConfig c = make_preset_config("qwen3", "qwen3-0.6b");
  PlanReport r = make_plan_report(c, {.tp_size = 4}, DType::BF16);
  for (const auto& p : r.parameters) {
    if (p.name.find("_proj.weight") == std::string::npos) continue;
    int64_t full = numel(p.global_shape) * 2;
    for (int64_t b : p.bytes_per_rank) EXPECT_EQ(b * 4, full) << p.name;
  }
  EXPECT_EQ(row(r, "model.layers.0.self_attn.q_norm.weight").style, "replicated_with_grad_allreduce");
  EXPECT_EQ(row(r, "model.layers.27.self_attn.k_norm.weight").style, "replicated_with_grad_allreduce");
  EXPECT_EQ(row(r, "lm_head.weight").tied_to, "model.embed_tokens.weight");
  // Everything but the small norms is split four ways.
  EXPECT_LT(r.total_bytes_per_rank[0], r.total_bytes_unsharded / 4 + r.total_bytes_unsharded / 100);
  // Each layer all-reduces after o_proj and down_proj; the embedding all-reduces; lm_head all-gathers.
  int all_reduce = 0, all_gather = 0;
  for (const auto& col : r.collectives) (col.op == "all_reduce" ? all_reduce : all_gather)++;
  EXPECT_EQ(all_reduce, 2 * 28 + 1);
  EXPECT_EQ(all_gather, 1);
}
