// DeepSeek-V2/V3 (MLA, MoE layers) without the multi-rank suite: what its config
// accepts and rejects (by message), the plans it ships, the latent KV cache's
// shape, yarn's scale; and Mistral's / layer_types' window keys. tp = 1..4 equivalence, KV
// decoding and the PyTorch oracle are in test_models and test_reference.
#include <gtest/gtest.h>

#include <cmath>

#include "models/model_test_util.h"
#include "ops/op_test_util.h"
#include "tp/models/auto.h"
#include "tp/models/deepseek_v2.h"
#include "tp/models/presets.h"

using namespace tp;
using tp::test::expect_error;

namespace {

ModelConfig preset_with(const std::string& arch, const std::string& preset, const nlohmann::json& changes) {
  nlohmann::json raw = make_preset_config(arch, preset).to_json();
  for (auto it = changes.begin(); it != changes.end(); ++it) {
    if (it.value().is_null() && it.key() != "rope_scaling")
      raw.erase(it.key());
    else
      raw[it.key()] = it.value();
  }
  return ModelConfig::from_json(raw, "config.json");
}

}  // namespace

TEST(DeepseekV2, LayersFromFirstKDenseReplaceAreMoeWithSharedExperts) {
  auto lm = AutoModelForCausalLM::from_config(make_preset_config("deepseek_v2", "tiny"));
  auto& ds = dynamic_cast<DeepseekV2ForCausalLM&>(*lm);
  ASSERT_NE(ds.model.layers[0]->dense, nullptr);
  EXPECT_EQ(ds.model.layers[0]->moe, nullptr);
  const SparseMoeBlock* moe = ds.model.layers[1]->moe;
  ASSERT_NE(moe, nullptr);
  EXPECT_EQ(moe->experts.gate_up_proj.global_shape, (Shape{8, 48, 96}));
  ASSERT_NE(moe->shared_experts, nullptr);  // moe_intermediate_size 24 x n_shared_experts 2
  EXPECT_EQ(moe->shared_experts->gate_proj.weight.global_shape, (Shape{48, 96}));
  EXPECT_EQ(moe->gate.e_score_correction_bias, nullptr);
  EXPECT_FALSE(moe->gate.scoring().renormalize);  // Transformers' V2 ignores norm_topk_prob
  const ModelConfig v3 = make_preset_config("deepseek_v3", "tiny");
  const MoeConfig m = deepseek_moe_config(v3, deepseek_sizes(v3));
  EXPECT_TRUE(m.scoring.sigmoid && m.scoring.renormalize && m.scoring.group_sum_top2 && m.score_correction_bias);
  EXPECT_EQ(m.scoring.n_group, 4);
  EXPECT_EQ(m.scoring.topk_group, 2);
  EXPECT_DOUBLE_EQ(m.scoring.scaling, 2.5);
  // No routed experts: every layer is dense whatever first_k_dense_replace says.
  auto dense = AutoModelForCausalLM::from_config(
      preset_with("deepseek_v2", "tiny", {{"first_k_dense_replace", 0}, {"n_routed_experts", nullptr}}));
  for (const auto* l : dynamic_cast<DeepseekV2ForCausalLM&>(*dense).model.layers) EXPECT_NE(l->dense, nullptr);
}

TEST(DeepseekV2, MoeConfigErrorsNameTheKeyAndWhatIsAccepted) {
  auto fails = [](const std::string& arch, const std::string& preset, const nlohmann::json& changes,
                  std::vector<std::string> parts) {
    expect_error([&] { AutoModelForCausalLM::from_config(preset_with(arch, preset, changes)); }, parts);
  };
  fails("deepseek_v2", "tiny", {{"topk_method", "noaux_tc"}},
        {"config.json", "topk_method 'noaux_tc' is not supported for deepseek_v2; supported: greedy, "
                        "group_limited_greedy"});
  fails("deepseek_v3", "tiny", {{"topk_method", "greedy"}},
        {"topk_method 'greedy' is not supported for deepseek_v3; supported: noaux_tc"});
  fails("deepseek_v2", "tiny", {{"scoring_func", "sigmoid"}},
        {"scoring_func 'sigmoid' is not supported for deepseek_v2; supported: softmax"});
  fails("deepseek_v2", "tiny", {{"moe_intermediate_size", nullptr}}, {"required key 'moe_intermediate_size'"});
  fails("deepseek_v2", "tiny", {{"num_experts_per_tok", 9}},
        {"'num_experts_per_tok' (9) is more than the 8 experts ('n_routed_experts')"});
  fails("deepseek_v2", "tiny-q-lora", {{"n_group", 3}},
        {"'n_group' (3) must divide 'n_routed_experts' (8) for topk_method group_limited_greedy"});
  fails("deepseek_v2", "tiny-q-lora", {{"topk_group", 3}}, {"'topk_group' (3) must be in [1, n_group = 2]"});
  fails("deepseek_v2", "tiny-q-lora", {{"num_experts_per_tok", 5}},
        {"'num_experts_per_tok' (5) is more than the 4 experts of the 'topk_group' (1) groups kept"});
  fails("deepseek_v3", "tiny", {{"n_group", 8}, {"topk_group", 4}},
        {"noaux_tc scores a group by its two best experts", "8 / 8"});
  fails("deepseek_v3", "tiny", {{"routed_scaling_factor", -1}}, {"'routed_scaling_factor' must be a positive number"});
  fails("deepseek_v3", "tiny", {{"rope_interleave", "yes"}}, {"'rope_interleave' must be true or false"});
  // Keys only some models read, typed like the rest (fuzz_model_config: "mlp_bias": "LORA" escaped as a json
  // type_error naming no key).
  fails("deepseek_v2", "tiny", {{"scoring_func", 1}}, {"config.json", "'scoring_func' must be a string, got 1"});
  fails("deepseek_v3", "tiny", {{"norm_topk_prob", "yes"}}, {"'norm_topk_prob' must be true or false"});
  fails("qwen3_moe", "tiny", {{"output_router_logits", 0}}, {"'output_router_logits' must be true or false"});
  fails("llama", "tiny", {{"mlp_bias", "LORA"}}, {"config.json", "'mlp_bias' must be true or false, got \"LORA\""});
}

TEST(DeepseekV3, RopeInterleaveKeepsV2sPairsAndFalseRotatesHalves) {
  const ModelConfig c = make_preset_config("deepseek_v3", "tiny");
  EXPECT_EQ(mla_rope(c, deepseek_sizes(c)).options.layout, ops::RopeLayout::Interleaved);
  const ModelConfig half = preset_with("deepseek_v3", "tiny", {{"rope_interleave", false}});
  EXPECT_EQ(mla_rope(half, deepseek_sizes(half)).options.layout, ops::RopeLayout::RotateHalf);
}

TEST(DeepseekV2, ShipsTheExpertAndSharedExpertPlans) {
  auto has = [](const parallel::Plan& plan, const std::string& key, const std::string& style) {
    return std::find(plan.begin(), plan.end(), std::pair{key, style}) != plan.end();
  };
  auto v2 = AutoModelForCausalLM::from_config(make_preset_config("deepseek_v2", "tiny"));
  auto v3 = AutoModelForCausalLM::from_config(make_preset_config("deepseek_v3", "tiny"));
  for (const auto* m : {v2.get(), v3.get()}) {
    const parallel::Plan tp = m->shipped_plan(), ep = m->shipped_ep_plan();
    EXPECT_TRUE(has(tp, "model.layers.*.mlp.experts.gate_up_proj", "packed_colwise"));
    EXPECT_TRUE(has(tp, "model.layers.*.mlp.experts.down_proj", "rowwise"));
    EXPECT_TRUE(has(tp, "model.layers.*.mlp.experts", "moe_tp_experts"));
    EXPECT_TRUE(has(tp, "model.layers.*.mlp.shared_experts.gate_proj", "colwise"));
    EXPECT_TRUE(has(tp, "model.layers.*.mlp.shared_experts.up_proj", "colwise"));
    EXPECT_TRUE(has(tp, "model.layers.*.mlp.shared_experts.down_proj", "rowwise"));
    EXPECT_TRUE(has(tp, "model.layers.*.mlp.gate_proj", "colwise"));
    EXPECT_TRUE(has(ep, "model.layers.*.mlp.gate", "ep_router"));
    EXPECT_TRUE(has(ep, "model.layers.*.mlp.experts.gate_up_proj", "grouped_gemm"));
    EXPECT_TRUE(has(ep, "model.layers.*.mlp.experts", "moe_tp_experts"));
  }
  // V3's plan leaves the attention replicated.
  for (const auto& [key, style] : v3->shipped_plan()) EXPECT_EQ(key.find("self_attn"), std::string::npos) << key;
  EXPECT_TRUE(has(v2->shipped_plan(), "model.layers.*.self_attn.o_proj", "rowwise"));
}

TEST(DeepseekV2, ConfigErrorsNameTheKey) {
  expect_error([] { AutoModelForCausalLM::from_config(preset_with("deepseek_v2", "tiny", {{"kv_lora_rank", nullptr}})); },
               {"config.json", "required key 'kv_lora_rank' is missing", "deepseek_v2"});
  expect_error([] { AutoModelForCausalLM::from_config(preset_with("deepseek_v2", "tiny", {{"qk_rope_head_dim", 7}})); },
               {"'qk_rope_head_dim' must be even", "7"});
  expect_error([] { AutoModelForCausalLM::from_config(preset_with("deepseek_v2", "tiny", {{"v_head_dim", -2}})); },
               {"'v_head_dim' must be a non-negative integer", "-2"});
  expect_error(
      [] { AutoModelForCausalLM::from_config(preset_with("deepseek_v2", "tiny", {{"num_key_value_heads", 4}})); },
      {"'num_key_value_heads' (4) must equal 'num_attention_heads' (12)"});
  expect_error(
      [] {
        AutoModelForCausalLM::from_config(preset_with(
            "deepseek_v2", "tiny",
            {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}));
      },
      {"rope_scaling type 'linear' is not supported for deepseek_v2 models; supported: default, yarn"});
}

TEST(DeepseekV2, ShipsTheAttentionPlanOfItsQueryPath) {
  auto plain = AutoModelForCausalLM::from_config(make_preset_config("deepseek_v2", "tiny"));
  auto lora = AutoModelForCausalLM::from_config(make_preset_config("deepseek_v2", "tiny-q-lora"));
  auto has = [](const parallel::Plan& plan, const std::string& key, const std::string& style) {
    return std::find(plan.begin(), plan.end(), std::pair{key, style}) != plan.end();
  };
  EXPECT_TRUE(has(plain->shipped_plan(), "model.layers.*.self_attn.q_proj", "colwise"));
  EXPECT_TRUE(has(lora->shipped_plan(), "model.layers.*.self_attn.q_b_proj", "colwise"));
  for (const auto* m : {plain.get(), lora.get()}) {
    EXPECT_TRUE(has(m->shipped_plan(), "model.layers.*.self_attn.kv_a_proj_with_mqa", "mla_kv_a_proj"));
    EXPECT_TRUE(has(m->shipped_plan(), "model.layers.*.self_attn.kv_b_proj", "colwise"));
    EXPECT_TRUE(has(m->shipped_plan(), "model.layers.*.self_attn.o_proj", "rowwise"));
    EXPECT_TRUE(has(m->shipped_plan(), "lm_head", "colwise_gather_output"));
  }
  // Whole heads per rank, checked before any weight is read.
  expect_error([&] { resolve_model_plan(*lora, {}, 5, nullptr); },
               {"num_attention_heads 12 is not divisible by tp_size 5", "model.layers.0.self_attn.q_b_proj"});
}

TEST(DeepseekV2, KvCacheHoldsTheLatentAndTheSharedRopeKey) {
  auto lm = AutoModelForCausalLM::from_config(make_preset_config("deepseek_v2", "tiny"));
  KVState state = lm->make_kv_state(3, 20);
  ASSERT_EQ(state.layers.size(), 2u);
  // kv_lora_rank 32 + qk_rope_head_dim 8 per token, not 12 heads x (16 + 8 + 16).
  EXPECT_EQ(state.layers[0].keys().shape(), (Shape{3, 20, 1, 32}));
  EXPECT_EQ(state.layers[0].values().shape(), (Shape{3, 20, 1, 8}));
}

TEST(DeepseekV2, YarnScalesTheSoftmaxByMscaleSquared) {
  const ModelConfig c = make_preset_config("deepseek_v2", "tiny");
  const MlaRope r = mla_rope(c, deepseek_sizes(c));
  const double m = 0.1 * 0.707 * std::log(4.0) + 1.0;
  EXPECT_NEAR(r.scale, m * m / std::sqrt(24.0), 1e-12);
  EXPECT_FLOAT_EQ(r.options.attention_factor, 1.f);  // mscale == mscale_all_dim
  EXPECT_EQ(r.options.layout, ops::RopeLayout::Interleaved);
  ASSERT_EQ(r.inv_freq.size(), 4u);
  // Correction range [0, 2) of 4 frequencies: the first kept, the last two interpolated (/ factor 4).
  const std::vector<float> base = ops::rope_inv_freq(8, 10000.0);
  EXPECT_FLOAT_EQ(r.inv_freq[0], base[0]);
  EXPECT_FLOAT_EQ(r.inv_freq[1], 0.5f * base[1] + 0.5f * base[1] / 4);
  EXPECT_FLOAT_EQ(r.inv_freq[3], base[3] / 4);
  // mscale != mscale_all_dim: cos and sin scaled by their ratio.
  const ModelConfig c2 = preset_with("deepseek_v2", "tiny",
                                     {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0},
                                                        {"original_max_position_embeddings", 64},
                                                        {"mscale", 1.0}, {"mscale_all_dim", 0.5}}}});
  EXPECT_FLOAT_EQ(mla_rope(c2, deepseek_sizes(c2)).options.attention_factor,
                  static_cast<float>(ops::yarn_mscale(4, 1.0) / ops::yarn_mscale(4, 0.5)));
}

TEST(DeepseekV2, MlaKvAProjNeedsTheRopeWidth) {
  // The registered style knows no qk_rope_head_dim: on a model whose config has
  // none it is an error naming the module, before any weight is read.
  auto lm = AutoModelForCausalLM::from_config(make_preset_config("llama", "tiny"));
  parallel::DistributedConfig dc{.tp_plan = R"({"model.layers.*.self_attn.k_proj": "mla_kv_a_proj"})"};
  parallel::StyleOverrides overrides;
  parallel::ResolvedPlan plan = resolve_model_plan(*lm, dc, 2, &overrides);
  expect_error([&] { parallel::apply_plan(*lm, plan, {2, 0}, nullptr, overrides); },
               {"'model.layers.0.self_attn.k_proj' has style mla_kv_a_proj, which needs qk_rope_head_dim",
                "add qk_rope_head_dim to config.json"});
}

TEST(SlidingWindow, ConfigKeysAreCheckedByMessage) {
  expect_error([] { AutoModelForCausalLM::from_config(preset_with("mistral", "tiny", {{"sliding_window", 0}})); },
               {"config.json", "'sliding_window' must be a positive integer or null", "0"});
  expect_error(
      [] {
        AutoModelForCausalLM::from_config(preset_with("mistral", "tiny", {{"layer_types", {"sliding_attention"}}}));
      },
      {"'layer_types' must list one type per layer (2 layers)"});
  expect_error(
      [] {
        AutoModelForCausalLM::from_config(preset_with(
            "mistral", "tiny", {{"sliding_window", 8}, {"layer_types", {"sliding_attention", "chunked_attention"}}}));
      },
      {"layer_types[1] is \"chunked_attention\"", "supported: \"sliding_attention\", \"full_attention\""});
  expect_error(
      [] {
        AutoModelForCausalLM::from_config(
            preset_with("llama", "tiny", {{"layer_types", {"sliding_attention", "full_attention"}}}));
      },
      {"layer_types[0] is \"sliding_attention\" but 'sliding_window' is not set"});
}

TEST(SlidingWindow, LayerTypesAlternateWindowedAndFullLayers) {
  auto lm = AutoModelForCausalLM::from_config(
      preset_with("mistral", "tiny", {{"sliding_window", 128}, {"layer_types", {"sliding_attention", "full_attention"}}}));
  auto& llama = dynamic_cast<LlamaForCausalLM&>(*lm);
  EXPECT_EQ(llama.model.layers[0]->self_attn.sliding_window, 128);
  EXPECT_EQ(llama.model.layers[1]->self_attn.sliding_window, 0);
  auto mistral = AutoModelForCausalLM::from_config(preset_with("mistral", "tiny", {{"sliding_window", 4}}));
  for (const LlamaDecoderLayer* l : dynamic_cast<LlamaForCausalLM&>(*mistral).model.layers)
    EXPECT_EQ(l->self_attn.sliding_window, 4);
}
