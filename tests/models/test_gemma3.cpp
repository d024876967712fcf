// Gemma 3 text without the multi-rank suite: which layers slide and which rope
// each gets as Gemma3TextConfig derives them, the keys it refuses (by message),
// and its shipped plans. tp = 1..4 equivalence, KV decoding past the window and
// the PyTorch oracle are in test_models and test_reference.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/op_test_util.h"
#include "tp/models/auto.h"
#include "tp/models/gemma3.h"
#include "tp/models/presets.h"
#include "tp/ops/rope.h"

using namespace tp;
using tp::test::expect_error;

namespace {

ModelConfig tiny_with(const nlohmann::json& changes, const std::vector<std::string>& erase = {}) {
  nlohmann::json raw = make_preset_config("gemma3_text", "tiny").to_json();
  for (const std::string& k : erase) raw.erase(k);
  for (auto it = changes.begin(); it != changes.end(); ++it) raw[it.key()] = it.value();
  return ModelConfig::from_json(raw, "config.json");
}

}  // namespace

TEST(Gemma3, EveryPatternthLayerIsGlobalWithoutLayerTypes) {
  // Gemma3TextConfig: "sliding_attention" unless (i + 1) % sliding_window_pattern == 0; the pattern defaults to 6.
  Gemma3Layers g = gemma3_layers(tiny_with({{"num_hidden_layers", 13}}, {"sliding_window_pattern"}));
  for (int64_t i = 0; i < 13; ++i) EXPECT_EQ(g.window[i], (i + 1) % 6 == 0 ? 0 : 4) << "layer " << i;
  g = gemma3_layers(tiny_with({{"num_hidden_layers", 4}, {"sliding_window_pattern", 2}}));
  EXPECT_EQ(g.window, (std::vector<int64_t>{4, 0, 4, 0}));
  // layer_types wins over the pattern.
  g = gemma3_layers(tiny_with({{"layer_types", {"full_attention", "sliding_attention"}}}));
  EXPECT_EQ(g.window, (std::vector<int64_t>{0, 4}));
  // sliding_window defaults to 4096.
  g = gemma3_layers(tiny_with({}, {"sliding_window"}));
  EXPECT_EQ(g.window[0], 4096);
}

TEST(Gemma3, LocalLayersUseTheLocalBaseUnscaledAndGlobalOnesTheScaledTheta) {
  const ModelConfig c = tiny_with({});  // rope_theta 1e6, rope_local_base_freq 1e4, linear x8
  const Gemma3Layers g = gemma3_layers(c);
  const std::vector<float> local = ops::rope_inv_freq(c.head_dim, 10000.0), global = ops::rope_inv_freq(c.head_dim, 1e6);
  ASSERT_EQ(g.local_inv_freq.size(), local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    EXPECT_EQ(g.local_inv_freq[i], local[i]) << i;
    EXPECT_FLOAT_EQ(g.global_inv_freq[i], global[i] / 8.0f) << i;
  }
  EXPECT_DOUBLE_EQ(g.scale, 1.0 / std::sqrt(24.0));  // query_pre_attn_scalar, not head_dim
  // Gemma3TextConfig's defaults: rope_theta 1e6 (not Llama's 1e4), query_pre_attn_scalar 256.
  const Gemma3Layers d = gemma3_layers(tiny_with({}, {"rope_theta", "rope_scaling", "query_pre_attn_scalar"}));
  for (size_t i = 0; i < global.size(); ++i) EXPECT_EQ(d.global_inv_freq[i], global[i]) << i;
  EXPECT_DOUBLE_EQ(d.scale, 1.0 / 16.0);
  // Transformers v5's per-type rope_parameters.
  const Gemma3Layers v5 = gemma3_layers(tiny_with(
      {{"rope_parameters",
        {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
         {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}},
      {"rope_theta", "rope_scaling", "rope_local_base_freq"}));
  EXPECT_EQ(v5.global_inv_freq, g.global_inv_freq);
  EXPECT_EQ(v5.local_inv_freq, g.local_inv_freq);
}

TEST(Gemma3, RefusedKeysNameTheirValues) {
  expect_error([] { gemma3_layers(tiny_with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}})); },
               {"config.json", "yarn", "supported: default, linear"});
  expect_error([] { gemma3_layers(tiny_with({{"hidden_activation", "silu"}})); },
               {"config.json", "hidden_activation 'silu'", "gelu_pytorch_tanh"});
  expect_error([] { gemma3_layers(tiny_with({{"use_bidirectional_attention", true}})); },
               {"config.json", "use_bidirectional_attention"});
  expect_error([] { gemma3_layers(tiny_with({{"attn_logit_softcapping", 50.0}})); },
               {"config.json", "attn_logit_softcapping", "50"});
  gemma3_layers(tiny_with({{"attn_logit_softcapping", nullptr}}));  // Gemma 3's own value
  expect_error([] { gemma3_layers(tiny_with({{"layer_types", {"sliding_attention", "chunked_attention"}}})); },
               {"config.json", "layer_types[1]", "chunked_attention"});
  expect_error([] { gemma3_layers(tiny_with({{"sliding_window_pattern", 0}})); },
               {"config.json", "sliding_window_pattern", "0"});
  expect_error([] { AutoModelForCausalLM::from_config(tiny_with({{"final_logit_softcapping", -1.0}})); },
               {"config.json", "final_logit_softcapping", "-1"});
}

TEST(Gemma3, ShipsTransformersPlanWithItsNormsGradientsAllReduced) {
  const ModelConfig c = tiny_with({});
  std::unique_ptr<CausalLM> lm = AutoModelForCausalLM::from_config(c);
  EXPECT_DOUBLE_EQ(lm->final_logit_softcapping(), 2.0);
  EXPECT_EQ(lm->default_lora_targets(), (std::vector<std::string>{"q_proj", "v_proj"}));
  const parallel::Plan plan = lm->shipped_plan();
  const parallel::Plan want = {{"model.layers.*.self_attn.q_proj", "colwise"},
                               {"model.layers.*.self_attn.k_proj", "colwise"},
                               {"model.layers.*.self_attn.v_proj", "colwise"},
                               {"model.layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                               {"model.layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"},
                               {"model.layers.*.self_attn.o_proj", "rowwise"},
                               {"model.layers.*.mlp.gate_proj", "colwise"},
                               {"model.layers.*.mlp.up_proj", "colwise"},
                               {"model.layers.*.mlp.down_proj", "rowwise"},
                               {"model.embed_tokens", "embedding_rowwise"},  // tied: vocab-parallel
                               {"lm_head", "colwise_gather_output"}};
  EXPECT_EQ(plan, want);
  // Untied (and no cap): no embedding entry; nothing caps the logits.
  std::unique_ptr<CausalLM> untied =
      AutoModelForCausalLM::from_config(tiny_with({{"tie_word_embeddings", false}, {"final_logit_softcapping", nullptr}}));
  EXPECT_EQ(untied->shipped_plan().size(), want.size() - 1);
  EXPECT_EQ(untied->final_logit_softcapping(), 0.0);
  // Sequence parallel: all four norms of a layer on shards.
  int norms = 0;
  for (const auto& [key, style] : untied->sequence_parallel_plan())
    if (key.find("layernorm") != std::string::npos) norms += style == "sequence_parallel";
  EXPECT_EQ(norms, 4);
}
