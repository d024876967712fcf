// Presets: real models' configs and Hub tensor names/shapes, and the
// deterministic Transformers-like initialization.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "tp/models/auto.h"
#include "tp/models/phi3.h"
#include "tp/models/presets.h"
#include "tp/models/rope_config.h"

namespace tp {
namespace {

int64_t param_count(const std::vector<ParamSpec>& layout) {
  int64_t n = 0;
  for (const ParamSpec& p : layout) n += numel(p.shape);
  return n;
}

TEST(Presets, Qwen3_0_6bHasTheRealNamesAndShapes) {
  ModelConfig c = make_preset_config("qwen3", "qwen3-0.6b");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"Qwen3ForCausalLM"});
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  std::vector<ParamSpec> layout = checkpoint_layout(c);
  EXPECT_EQ(layout.size(), 1u + 28 * 11 + 1);  // embed, 11 per layer, norm; no lm_head (tied)
  // Qwen3-0.6B: 0.6B parameters, 0.44B of them outside the embedding (model card).
  EXPECT_EQ(param_count(layout), 596049920);
  std::map<std::string, Shape> by_name;
  for (const ParamSpec& p : layout) by_name[p.name] = p.shape;
  const std::map<std::string, Shape> layer0 = {
      {"model.layers.0.self_attn.q_proj.weight", {2048, 1024}},
      {"model.layers.0.self_attn.k_proj.weight", {1024, 1024}},
      {"model.layers.0.self_attn.v_proj.weight", {1024, 1024}},
      {"model.layers.0.self_attn.o_proj.weight", {1024, 2048}},
      {"model.layers.0.self_attn.q_norm.weight", {128}},
      {"model.layers.0.self_attn.k_norm.weight", {128}},
      {"model.layers.0.mlp.gate_proj.weight", {3072, 1024}},
      {"model.layers.0.mlp.up_proj.weight", {3072, 1024}},
      {"model.layers.0.mlp.down_proj.weight", {1024, 3072}},
      {"model.layers.0.input_layernorm.weight", {1024}},
      {"model.layers.0.post_attention_layernorm.weight", {1024}},
  };
  for (auto& [name, shape] : layer0) EXPECT_EQ(by_name.at(name), shape) << name;
  EXPECT_EQ(by_name.at("model.embed_tokens.weight"), (Shape{151936, 1024}));
  EXPECT_EQ(by_name.at("model.norm.weight"), (Shape{1024}));
  EXPECT_EQ(by_name.at("model.layers.27.mlp.down_proj.weight"), (Shape{1024, 3072}));
  EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
  EXPECT_EQ(c.base_model_tp_plan.size(), 9u);
}

TEST(Presets, LargeModelsHaveTheirPublishedParameterCounts) {
  EXPECT_EQ(param_count(checkpoint_layout(make_preset_config("llama", "llama-3-8b"))), 8030261248);
  EXPECT_EQ(param_count(checkpoint_layout(make_preset_config("llama", "llama-2-7b"))), 6738415616);
  EXPECT_EQ(param_count(checkpoint_layout(make_preset_config("mistral", "mistral-7b"))), 7241732096);
  EXPECT_EQ(param_count(checkpoint_layout(make_preset_config("llama", "llama-3.2-1b"))), 1235814400);
  EXPECT_EQ(param_count(checkpoint_layout(make_preset_config("qwen3", "qwen3-8b"))), 8190735360);
  ModelConfig l32 = make_preset_config("llama", "llama-3.2-1b");
  EXPECT_EQ(l32.rope_scaling.rope_type, "llama3");
  EXPECT_DOUBLE_EQ(l32.rope_scaling.factor, 32.0);
  EXPECT_TRUE(l32.tie_word_embeddings);
}

// `c` cut to one layer (a tree of the real shapes, built quickly).
ModelConfig first_layer(const ModelConfig& c) {
  nlohmann::json raw = c.raw;
  raw["num_hidden_layers"] = 1;
  return ModelConfig::from_json(raw, c.source);
}

// Phi-3.5-mini: the Hub's fused names and shapes, 3,821,079,552 parameters (as Phi-3-mini's,
// whose 4k config has no rope_scaling), LongRoPE over 4096 of 131072 positions.
TEST(Presets, Phi3HasTheRealNamesShapesAndLongRope) {
  const ModelConfig c = make_preset_config("phi3", "phi-3.5-mini");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"Phi3ForCausalLM"});
  EXPECT_FALSE(c.raw.contains("head_dim"));  // Phi3Config derives it
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_EQ(c.raw["original_max_position_embeddings"], 4096);
  EXPECT_EQ(c.raw["sliding_window"], 262144);
  EXPECT_EQ(c.raw["rope_scaling"]["type"], "longrope");
  const std::vector<ParamSpec> layout = checkpoint_layout(c);
  EXPECT_EQ(param_count(layout), 3821079552);
  EXPECT_EQ(param_count(layout), param_count(checkpoint_layout(make_preset_config("phi3", "phi-3-mini-4k"))));
  std::map<std::string, Shape> by_name;
  for (const ParamSpec& p : layout) by_name[p.name] = p.shape;
  EXPECT_EQ(by_name.size(), 1u + 32 * 6 + 2);  // embed, 6 per layer, norm, lm_head
  const std::map<std::string, Shape> layer0 = {{"model.layers.0.self_attn.qkv_proj.weight", {9216, 3072}},
                                               {"model.layers.0.self_attn.o_proj.weight", {3072, 3072}},
                                               {"model.layers.0.mlp.gate_up_proj.weight", {16384, 3072}},
                                               {"model.layers.0.mlp.down_proj.weight", {3072, 8192}},
                                               {"model.layers.0.input_layernorm.weight", {3072}},
                                               {"model.layers.0.post_attention_layernorm.weight", {3072}}};
  for (const auto& [name, shape] : layer0) EXPECT_EQ(by_name[name], shape) << name;
  EXPECT_EQ(by_name["lm_head.weight"], (Shape{32064, 3072}));

  const LongRope rope = longrope_for(c, c.head_dim);
  EXPECT_EQ(rope.original_max_position_embeddings, 4096);
  EXPECT_NEAR(rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-12);  // 1.1902
  ASSERT_EQ(rope.short_inv_freq.size(), 48u);
  // Frequency i divided by its factor: short_factor[0] = 1.0, long_factor[47] = 64.84.
  EXPECT_FLOAT_EQ(rope.short_inv_freq[0], 1.0f);
  EXPECT_NEAR(rope.long_inv_freq[47], 1.0 / (64.83999633789062 * std::pow(10000.0, 94.0 / 96)), 1e-12);
  EXPECT_EQ(rope.inv_freq_for(4096).data(), rope.short_inv_freq.data());  // within the original context
  EXPECT_EQ(rope.inv_freq_for(4097).data(), rope.long_inv_freq.data());
  // Without the key, Phi3Config's default (4096), not max_position_embeddings.
  nlohmann::json raw = c.raw;
  raw.erase("original_max_position_embeddings");
  const ModelConfig without = ModelConfig::from_json(raw, "x");
  EXPECT_EQ(longrope_for(without, without.head_dim, 4096).original_max_position_embeddings, 4096);
  EXPECT_EQ(longrope_for(without, without.head_dim).original_max_position_embeddings, 131072);
  std::unique_ptr<CausalLM> tree = AutoModelForCausalLM::from_config(first_layer(without));
  const auto& phi3 = dynamic_cast<const Phi3ForCausalLM&>(*tree);
  EXPECT_EQ(phi3.inv_freq_for(4096), rope.short_inv_freq);
  EXPECT_EQ(phi3.inv_freq_for(4097), rope.long_inv_freq);
}

// The tree's checks of a phi3 config name the file and the key.
TEST(Presets, Phi3ConfigErrorsNameFileAndKey) {
  auto error_of = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json raw = make_preset_config("phi3", "tiny").raw;  // head_dim 16, 12 rotary dims
    edit(raw);
    try {
      AutoModelForCausalLM::from_config(ModelConfig::from_json(raw, "m/config.json"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of([](nlohmann::json&) {}), "");
  EXPECT_NE(error_of([](nlohmann::json& j) { j["rope_scaling"]["short_factor"] = {1.0, 2.0}; })
                .find("m/config.json: rope_scaling 'short_factor' has 2 entries; the rotary dim 12 needs 6"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) { j["partial_rotary_factor"] = 1.5; })
                .find("m/config.json: 'partial_rotary_factor' must be a number in (0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) { j["partial_rotary_factor"] = 0.1; })
                .find("head_dim 16 x partial_rotary_factor 0.1 gives 1 rotary dims"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; })
                .find("m/config.json: rope_scaling type 'linear' is not supported for phi3"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) { j["original_max_position_embeddings"] = "4k"; })
                .find("m/config.json: 'original_max_position_embeddings' must be a positive integer, got \"4k\""),
            std::string::npos);
}

TEST(Presets, Gemma3OneBHasItsShapesAndDefaults) {
  // google/gemma-3-1b-pt's config.json: no tie_word_embeddings key (tied by Gemma3TextConfig's default), no
  // hidden_act (hidden_activation), one KV head, every 6th layer global.
  ModelConfig c = make_preset_config("gemma3_text", "gemma-3-1b");
  EXPECT_FALSE(c.raw.contains("tie_word_embeddings"));
  EXPECT_FALSE(c.raw.contains("hidden_act"));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.to_json().contains("hidden_act"));
  // 262144 x 1152 embedding + 26 layers of (q, k, v, o, gate, up, down, 4 norms over 1152, q/k norms over 256) + norm.
  const int64_t layer = 1152 * 1024 * 2 + 1152 * 256 * 2 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256;
  EXPECT_EQ(param_count(checkpoint_layout(c)), 262144LL * 1152 + 26 * layer + 1152);
  EXPECT_EQ(param_count(checkpoint_layout(c)), 999885952);
  std::map<std::string, Shape> by_name;
  for (const ParamSpec& p : checkpoint_layout(c)) by_name[p.name] = p.shape;
  EXPECT_EQ(by_name.at("model.layers.25.self_attn.q_norm.weight"), (Shape{256}));
  EXPECT_EQ(by_name.at("model.layers.0.pre_feedforward_layernorm.weight"), (Shape{1152}));
  EXPECT_EQ(by_name.at("model.layers.0.post_feedforward_layernorm.weight"), (Shape{1152}));
  EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
  // gemma-3-4b's language model: 34 layers of 8 heads (4 KV) over 2560, linear x8 rope on the global layers.
  ModelConfig b4 = make_preset_config("gemma3_text", "gemma-3-4b");
  const int64_t layer4 = 2560 * 2048 * 2 + 2560 * 1024 * 2 + 3 * 2560 * 10240 + 4 * 2560 + 2 * 256;
  EXPECT_EQ(param_count(checkpoint_layout(b4)), 262208LL * 2560 + 34 * layer4 + 2560);
  EXPECT_EQ(b4.rope_scaling.rope_type, "linear");
}

TEST(Presets, TinyPresetsSplitAcrossRanks) {
  for (const std::string arch : {"llama", "mistral", "qwen3", "gemma3_text"}) {
    ModelConfig c = make_preset_config(arch, "tiny");
    EXPECT_EQ(c.num_attention_heads, 24) << arch;
    EXPECT_EQ(c.num_key_value_heads, 12) << arch;  // GQA; divisible by 1, 2, 3, 4
    EXPECT_EQ(c.vocab_size % 12, 0) << arch;       // lm_head gathers: must split evenly
    EXPECT_EQ(c.intermediate_size % 12, 0) << arch;
    EXPECT_EQ(c.num_hidden_layers, 2) << arch;
    EXPECT_EQ(c.max_position_embeddings, 256) << arch;
    EXPECT_EQ(c.raw["architectures"].size(), 1u) << arch;
  }
}

TEST(Presets, ErrorsListTheValidNames) {
  try {
    make_preset_config("gpt2", "tiny");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown architecture 'gpt2'; supported: deepseek_v2, deepseek_v3, gemma3_text, gpt_oss, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe"),
              std::string::npos);
  }
  try {
    make_preset_config("qwen3", "qwen3-70b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("supported: qwen3-0.6b, qwen3-8b, tiny"), std::string::npos) << e.what();
  }
}

// Qwen2.5-0.5B: 494,032,768 parameters (0.49B; 0.36B outside the embedding, model card):
// biases on q, k and v only, tied embeddings, head_dim = 896 / 14.
TEST(Presets, Qwen2_5_0_5bHasBiasesOnQkvOnly) {
  const ModelConfig c = make_preset_config("qwen2", "qwen2.5-0.5b");
  EXPECT_EQ(c.head_dim, 64);
  const std::vector<ParamSpec> layout = checkpoint_layout(c);
  EXPECT_EQ(param_count(layout), 494032768);
  std::map<std::string, Shape> by_name;
  for (const ParamSpec& p : layout) by_name[p.name] = p.shape;
  EXPECT_EQ(by_name.at("model.layers.3.self_attn.q_proj.bias"), (Shape{896}));
  EXPECT_EQ(by_name.at("model.layers.3.self_attn.k_proj.bias"), (Shape{128}));
  EXPECT_EQ(by_name.at("model.layers.3.self_attn.v_proj.bias"), (Shape{128}));
  EXPECT_FALSE(by_name.contains("model.layers.3.self_attn.o_proj.bias"));
  EXPECT_FALSE(by_name.contains("lm_head.weight"));
  EXPECT_FALSE(c.raw.contains("attention_bias"));  // Qwen2's config has no such key: the biases are the architecture's
}

TEST(Presets, AttentionBiasAddsBiases) {
  nlohmann::json raw = make_preset_config("llama", "tiny").raw;
  raw["attention_bias"] = true;
  auto layout = checkpoint_layout(ModelConfig::from_json(raw, "x"));
  auto it = std::find_if(layout.begin(), layout.end(),
                         [](const ParamSpec& p) { return p.name == "model.layers.1.self_attn.k_proj.bias"; });
  ASSERT_NE(it, layout.end());
  EXPECT_EQ(it->shape, (Shape{96}));
  EXPECT_EQ(it->init, ParamSpec::Init::Zeros);
}

// The checkpoint layout is read off the module tree: every parameter of the
// tree is in it under its own name, or under the Hub's per-expert names.
TEST(Presets, TheLayoutIsTheModuleTreeRenamedWhereTheHubDiffers) {
  for (const std::string& arch : preset_architectures()) {
    const ModelConfig c = make_preset_config(arch, "tiny");
    std::map<std::string, Shape> layout;
    for (const ParamSpec& p : checkpoint_layout(c)) layout[p.name] = p.shape;
    std::unique_ptr<CausalLM> tree = AutoModelForCausalLM::from_config(c);
    const std::map<std::string, std::string> tied = tree->tied_parameters();
    size_t fused = 0, same_name = 0;
    for (nn::Parameter* p : tree->parameters()) {
      if (tied.contains(p->name)) {
        EXPECT_FALSE(layout.contains(p->name)) << arch << ": tied " << p->name;
      } else if (layout.contains(p->name)) {
        EXPECT_EQ(layout.at(p->name), p->global_shape) << arch << ": " << p->name;
        ++same_name;
      } else {  // a fused expert parameter [E, ...]: E tensors per projection under the Hub's names
        EXPECT_TRUE(p->name.ends_with("mlp.experts.gate_up_proj") || p->name.ends_with("mlp.experts.down_proj") ||
                    p->name.ends_with("mlp.gate.weight"))
            << arch << ": " << p->name << " is not in the layout";
        fused += static_cast<size_t>(p->name.ends_with("gate_up_proj") ? 2 * p->global_shape[0]
                                     : p->name.ends_with("down_proj")  ? p->global_shape[0]
                                                                       : 1);
      }
    }
    EXPECT_EQ(layout.size(), same_name + fused) << arch;  // and nothing else
  }
  // Mixtral's experts and router under block_sparse_moe, as the Hub stores them.
  std::map<std::string, Shape> mixtral;
  for (const ParamSpec& p : checkpoint_layout(make_preset_config("mixtral", "tiny"))) mixtral[p.name] = p.shape;
  EXPECT_TRUE(mixtral.contains("model.layers.0.block_sparse_moe.gate.weight"));
  EXPECT_TRUE(mixtral.contains("model.layers.0.block_sparse_moe.experts.3.w3.weight"));
  EXPECT_FALSE(mixtral.contains("model.layers.0.mlp.experts.gate_up_proj"));
}

// Mistral's attention has no biases whatever config.json says: the tree (and so
// the layout the loader checks) leaves them out.
TEST(Presets, MistralHasNoAttentionBiases) {
  nlohmann::json raw = make_preset_config("mistral", "tiny").raw;
  raw["attention_bias"] = true;
  for (const ParamSpec& p : checkpoint_layout(ModelConfig::from_json(raw, "x")))
    EXPECT_FALSE(p.name.ends_with(".bias")) << p.name;
}

TEST(Init, NormalIsDeterministicPerNameAndSeed) {
  ParamSpec p{"model.layers.0.mlp.up_proj.weight", {384, 192}, ParamSpec::Init::Normal};
  for (DType d : {DType::F32, DType::BF16}) {
    Tensor a = init_param(p, 0.02, 42, d);
    EXPECT_TRUE(equal(a, init_param(p, 0.02, 42, d)));
    EXPECT_FALSE(equal(a, init_param(p, 0.02, 43, d)));
  }
  EXPECT_TRUE(equal(init_param(p, 0.02, 42, DType::BF16), init_param(p, 0.02, 42, DType::F32).to(DType::BF16)));
  // Element i does not depend on the tensor's size (nor on how threads split it).
  ParamSpec small{p.name, {1, 4097}, ParamSpec::Init::Normal};
  std::vector<float> big = init_param(p, 0.02, 42, DType::F32).to_vector();
  std::vector<float> part = init_param(small, 0.02, 42, DType::F32).to_vector();
  EXPECT_TRUE(std::equal(part.begin(), part.end(), big.begin()));
  // A different name gives different values; the statistics are N(0, 0.02).
  ParamSpec q = p;
  q.name = "model.layers.1.mlp.up_proj.weight";
  EXPECT_FALSE(equal(init_param(p, 0.02, 42, DType::F32), init_param(q, 0.02, 42, DType::F32)));
  std::vector<float> v = init_param(p, 0.02, 42, DType::F32).to_vector();
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += double(x) * x;
  double mean = sum / v.size(), sd = std::sqrt(sq / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.0005);
  ParamSpec norm{"model.norm.weight", {64}, ParamSpec::Init::Ones};
  EXPECT_TRUE(equal(init_param(norm, 0.02, 1, DType::BF16), Tensor::full({64}, 1.0, DType::BF16)));
}

}  // namespace
}  // namespace tp
