// config.json -> ModelConfig: defaults, rope_scaling variants, eos forms, the
// tp plan order, unknown keys kept, and errors naming the file and key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tp/models/config.h"
#include "tp/core/error.h"

namespace tp {
namespace {

using nlohmann::json;

json base() {
  return {{"model_type", "llama"},     {"hidden_size", 64},  {"intermediate_size", 128}, {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"vocab_size", 100}};
}

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j, "dir/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsFollowTransformers) {
  ModelConfig c = ModelConfig::from_json(base(), "x");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_scaling.rope_type, "default");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_TRUE(c.base_model_tp_plan.empty());
}

TEST(Config, GemmaTiesByDefaultAndAMultimodalConfigIsRefused) {
  json g = base();
  g["model_type"] = "gemma3_text";
  EXPECT_TRUE(ModelConfig::from_json(g, "x").tie_word_embeddings);  // Gemma3TextConfig keeps PretrainedConfig's
  g["tie_word_embeddings"] = false;
  EXPECT_FALSE(ModelConfig::from_json(g, "x").tie_word_embeddings);
  // Gemma3ForConditionalGeneration: the text model under text_config, its weights under language_model.
  const json vlm = {{"model_type", "gemma3"}, {"text_config", g}, {"vision_config", json::object()}};
  const std::string e = error_of(vlm);
  for (const char* part : {"dir/config.json", "'gemma3'", "text_config", "language_model.", "gemma3_text"})
    EXPECT_NE(e.find(part), std::string::npos) << part << " in: " << e;
}

TEST(Config, ReadsEveryField) {
  json j = base();
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 32;  // Qwen3 style: heads * head_dim != hidden
  j["rope_theta"] = 500000.0;
  j["rms_norm_eps"] = 1e-5;
  j["tie_word_embeddings"] = true;
  j["attention_bias"] = true;
  j["torch_dtype"] = "bfloat16";
  j["bos_token_id"] = 7;
  j["eos_token_id"] = {8, 9};
  j["architectures"] = {"LlamaForCausalLM"};
  j["some_future_key"] = {{"nested", 1}};
  ModelConfig c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_id, 7);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(c.architectures, std::vector<std::string>{"LlamaForCausalLM"});
  EXPECT_EQ(c.raw["some_future_key"]["nested"], 1);
  // Written back, unknown keys survive and the typed values round-trip.
  ModelConfig again = ModelConfig::from_json(c.to_json(), "y");
  EXPECT_EQ(again.raw["some_future_key"]["nested"], 1);
  EXPECT_EQ(again.eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(again.head_dim, 32);
  j["eos_token_id"] = 8;
  EXPECT_EQ(ModelConfig::from_json(j, "x").eos_token_ids, std::vector<int64_t>{8});
}

TEST(Config, RopeScalingVariants) {
  json j = base();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  ModelConfig c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.rope_scaling.rope_type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "y").rope_scaling.original_max_position_embeddings, 8192);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // older spelling
  EXPECT_EQ(ModelConfig::from_json(j, "x").rope_scaling.rope_type, "linear");

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768},
                       {"attention_factor", 1.1}};
  c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.rope_scaling.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 32);
  EXPECT_DOUBLE_EQ(*c.rope_scaling.attention_factor, 1.1);

  j["rope_scaling"] = nullptr;
  EXPECT_EQ(ModelConfig::from_json(j, "x").rope_scaling.rope_type, "default");

  // LongRoPE (Phi-3): "su" is its first name; written back as given (Phi3Config of
  // Transformers 4.x accepts exactly type, short_factor and long_factor).
  j["rope_scaling"] = {{"type", "su"}, {"short_factor", {1.0, 1.5}}, {"long_factor", {2.0, 4.0}}};
  c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.rope_scaling.rope_type, "longrope");
  EXPECT_EQ(c.rope_scaling.long_factor, (std::vector<double>{2.0, 4.0}));
  EXPECT_FALSE(c.rope_scaling.factor_given);
  EXPECT_EQ(c.to_json()["rope_scaling"],
            json({{"type", "longrope"}, {"short_factor", {1.0, 1.5}}, {"long_factor", {2.0, 4.0}}}));
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {2.0}}, {"factor", 4.0},
                       {"original_max_position_embeddings", 64}};
  c = ModelConfig::from_json(ModelConfig::from_json(j, "x").to_json(), "y");
  EXPECT_TRUE(c.rope_scaling.factor_given);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);

  // Newer files: rope_parameters with rope_theta inside.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_DOUBLE_EQ(ModelConfig::from_json(j, "x").rope_theta, 1e6);
}

TEST(Config, ErrorsNameFileKeyAndValue) {
  json j = base();
  j.erase("vocab_size");
  EXPECT_NE(error_of(j).find("dir/config.json: required key 'vocab_size' is missing"), std::string::npos);
  j = base();
  j.erase("model_type");
  EXPECT_NE(error_of(j).find("'model_type' is missing"), std::string::npos);
  j = base();
  j["hidden_size"] = 66;
  EXPECT_NE(error_of(j).find("hidden_size (66) is not a multiple of num_attention_heads (4)"), std::string::npos);
  j["head_dim"] = 16;  // an explicit head_dim makes it legal
  EXPECT_EQ(error_of(j), "");
  j = base();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
            std::string::npos);
  j = base();
  j["num_hidden_layers"] = "two";
  EXPECT_NE(error_of(j).find("'num_hidden_layers' must be an integer, got \"two\""), std::string::npos);
  j = base();
  j["num_attention_heads"] = 0;
  EXPECT_NE(error_of(j).find("'num_attention_heads' must be positive"), std::string::npos);
  j = base();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}};
  EXPECT_NE(error_of(j).find("needs 'high_freq_factor'"), std::string::npos);
  j["rope_scaling"] = {{"rope_type", "ntk"}};
  EXPECT_NE(error_of(j).find("unsupported rope_type 'ntk'; supported: default, linear, llama3, yarn"),
            std::string::npos);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.5}};
  EXPECT_NE(error_of(j).find("'factor' must be >= 1"), std::string::npos);
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}};
  EXPECT_NE(error_of(j).find("dir/config.json: rope_scaling (rope_type 'longrope') needs 'long_factor'"),
            std::string::npos);
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, "x"}}, {"long_factor", {1.0}}};
  EXPECT_NE(error_of(j).find("'short_factor' must be a non-empty list of numbers, got [1.0,\"x\"]"),
            std::string::npos);
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {0.0}}};
  EXPECT_NE(error_of(j).find("'long_factor' must hold positive numbers"), std::string::npos);
  j = base();
  j["base_model_tp_plan"] = {{"layers.*.mlp.up_proj", 3}};
  EXPECT_NE(error_of(j).find("base_model_tp_plan['layers.*.mlp.up_proj'] must be a style name"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("must be a JSON object"), std::string::npos);
}

TEST(Config, LoadKeepsPlanOrderAndRejectsBadJson) {
  auto dir = std::filesystem::temp_directory_path() / "tp_test_config";
  std::filesystem::create_directories(dir);
  auto file = dir / "config.json";
  std::ofstream(file) << R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
    "base_model_tp_plan": {"layers.*.self_attn.q_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
                           "layers.*.mlp.gate_proj": "colwise"}})";
  ModelConfig c = ModelConfig::load(file);
  ASSERT_EQ(c.base_model_tp_plan.size(), 3u);
  EXPECT_EQ(c.base_model_tp_plan[0].first, "layers.*.self_attn.q_proj");
  EXPECT_EQ(c.base_model_tp_plan[1].first, "layers.*.mlp.down_proj");
  EXPECT_EQ(c.base_model_tp_plan[2].second, "colwise");

  std::ofstream(file, std::ios::trunc) << "{\"model_type\": \"llama\", \"hidden_size\": \xff}";
  try {
    ModelConfig::load(file);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string() + ": not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ModelConfig::load(dir / "missing.json"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tp
