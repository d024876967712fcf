// A config.json that contradicts its weights fails at Checkpoint::open, from the
// tensor index alone, naming the key, its value and what the weights hold; a
// config with sizes no model could have fails before its module tree is built.
#include <gtest/gtest.h>
#include <malloc.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tp/models/auto.h"
#include "tp/models/checkpoint.h"
#include "tp/models/config_check.h"
#include "tp/models/presets.h"
#include "tp/core/error.h"

namespace tp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One tiny checkpoint per architecture, written once; cases copy its config and
// link its weights.
const fs::path& checkpoint_of(const std::string& arch) {
  struct Dirs : std::map<std::string, fs::path> {
    ~Dirs() {
      for (auto& [arch, dir] : *this) {
        fs::remove_all(dir);
        fs::remove_all(dir.string() + "_case");
      }
    }
  };
  static Dirs dirs;
  auto it = dirs.find(arch);
  if (it != dirs.end()) return it->second;
  fs::path dir = fs::temp_directory_path() / fmt::format("tp_config_check_{}_{}", arch, getpid());
  fs::remove_all(dir);
  ModelConfig c = make_preset_config(arch, "tiny");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamSpec& p : checkpoint_layout(c)) tensors.emplace_back(p.name, init_param(p, 0.02, 1, DType::F32));
  save_checkpoint(dir, c, tensors);
  return dirs[arch] = dir;
}

// The error Checkpoint::open gives for `arch`'s tiny weights under its config with `edit` applied.
std::string error_with(const std::string& arch, const std::function<void(json&)>& edit, double* seconds = nullptr) {
  const fs::path& base = checkpoint_of(arch);
  fs::path dir = base.string() + "_case";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink(base / "model.safetensors", dir / "model.safetensors");
  json cfg = json::parse(std::ifstream(base / "config.json"));
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    what = e.what();
  }
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!what.empty()) {
    EXPECT_NE(what.find((dir / "config.json").string()), std::string::npos) << what;
  }
  return what;
}

std::function<void(json&)> set(const std::string& key, json value) {
  return [key, value](json& c) { c[key] = value; };
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(ConfigCheck, TheUneditedConfigsPass) {
  for (const std::string arch : {"llama", "mistral", "qwen3"}) EXPECT_EQ(error_with(arch, [](json&) {}), "");
}

TEST(ConfigCheck, LayerCountAgainstTheWeightsTakesMillisecondsWhateverTheValue) {
  double seconds = 0;
  std::string e = error_with("llama", set("num_hidden_layers", 100000000), &seconds);
  EXPECT_HAS(e, "'num_hidden_layers' is 100000000 but the weights in");
  EXPECT_HAS(e, "hold 2 layers (model.layers.0 to model.layers.1)");
  EXPECT_LT(seconds, 0.2);
  e = error_with("qwen3", set("num_hidden_layers", 1));  // fewer layers than the weights: not silently dropped
  EXPECT_HAS(e, "'num_hidden_layers' is 1 but the weights in");
  EXPECT_HAS(e, "hold 2 layers");
}

TEST(ConfigCheck, EachSizeNamesTheKeyAndBothValues) {
  EXPECT_HAS(error_with("llama", set("hidden_size", 256)), "'hidden_size' is 256 but the weights have hidden size 192");
  EXPECT_HAS(error_with("llama", set("vocab_size", 1000)), "'vocab_size' is 1000 but the weights have 516 token embeddings");
  const std::string e = error_with("mistral", set("intermediate_size", 768));
  EXPECT_HAS(e, "'intermediate_size' is 768 but the weights have 384");
  EXPECT_HAS(e, "'model.layers.0.mlp.gate_proj.weight' is [384, 192]");
}

TEST(ConfigCheck, HeadCountsAndHeadDim) {
  EXPECT_HAS(error_with("llama", set("num_attention_heads", 12)),
             "'num_attention_heads' (12) x 'head_dim' (8) = 96 but the weights' query projection has 192 rows");
  EXPECT_HAS(error_with("llama", set("num_key_value_heads", 6)),
             "'num_key_value_heads' (6) x 'head_dim' (8) = 48 but the weights' key projection has 96 rows");
  EXPECT_HAS(error_with("llama", set("head_dim", 16)),
             "'num_attention_heads' (24) x 'head_dim' (16) = 384 but the weights' query projection has 192 rows");
  // Without a head_dim key it is hidden_size / num_attention_heads, and the message says so.
  EXPECT_HAS(error_with("llama",
                        [](json& c) {
                          c.erase("head_dim");
                          c["num_attention_heads"] = 12;
                        }),
             "'num_key_value_heads' (12) x head_dim (16 = hidden_size / num_attention_heads) = 192 but the weights' "
             "key projection has 96 rows");
  // Qwen3's q_norm holds head_dim itself.
  EXPECT_HAS(error_with("qwen3", set("head_dim", 8)), "'head_dim' (8) does not match the weights' head_dim 16");
}

TEST(ConfigCheck, TiedOrNot) {
  const std::string e = error_with("qwen3", set("tie_word_embeddings", false));
  EXPECT_HAS(e, "'tie_word_embeddings' is false but the weights in");
  EXPECT_HAS(e, "have no lm_head.weight");
}

TEST(ConfigCheck, EveryTensorIsStillCheckedAfterTheSummary) {
  fs::path dir = fs::temp_directory_path() / fmt::format("tp_config_check_layout_{}", getpid());
  fs::remove_all(dir);
  ModelConfig c = make_preset_config("llama", "tiny");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (ParamSpec p : checkpoint_layout(c)) {
    if (p.name == "model.layers.1.self_attn.v_proj.weight") p.shape = {96, 100};
    tensors.emplace_back(p.name, init_param(p, 0.02, 1, DType::F32));
  }
  save_checkpoint(dir, c, tensors);
  try {
    Checkpoint::open(dir);
    ADD_FAILURE() << "opened";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()),
               "tensor 'model.layers.1.self_attn.v_proj.weight' has shape [96, 100] but " +
                   (dir / "config.json").string() + " implies [96, 192]");
  }
  fs::remove_all(dir);
}

TEST(ConfigCheck, SizesNoModelHasAreRefusedAtParse) {
  json j = make_preset_config("llama", "tiny").raw;
  j["vocab_size"] = int64_t{1} << 40;
  try {
    ModelConfig::from_json(j, "dir/config.json");
    ADD_FAILURE() << "parsed";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "dir/config.json: 'vocab_size' is 1099511627776; sizes above 2147483647");
  }
}

ModelConfig tiny_with(const std::string& key, int64_t value) {
  json j = make_preset_config("llama", "tiny").raw;
  j[key] = value;
  return ModelConfig::from_json(j, "plan/config.json");
}

std::string tree_error(const ModelConfig& c, int64_t memory) {
  try {
    check_module_tree_fits(c, memory);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigCheck, WithoutWeightsTheModuleTreeMustFitInMemory) {
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(tree_error(make_preset_config("llama", "llama-3-8b"), 1 * gib), "");
  const std::string e = tree_error(tiny_with("num_hidden_layers", 100000000), 24 * gib);
  EXPECT_HAS(e, "plan/config.json: 'num_hidden_layers' is 100000000: building the module tree alone would take");
  EXPECT_HAS(e, "more than half of this machine's 24.0 GiB");
  // Products that overflow 64 bits are named, not wrapped around.
  json j = make_preset_config("llama", "tiny").raw;
  j["hidden_size"] = j["intermediate_size"] = j["num_hidden_layers"] = 2147483647;
  j["head_dim"] = 2;  // otherwise valid (RoPE rotates pairs): the count is what fails
  j["num_attention_heads"] = j["num_key_value_heads"] = 1;
  EXPECT_HAS(tree_error(ModelConfig::from_json(j, "x"), 24 * gib), "config sizes overflow: the parameter count does not fit in 64 bits");
  // from_config refuses before it builds anything.
  EXPECT_THROW(AutoModelForCausalLM::from_config(tiny_with("num_hidden_layers", 1000000000)), Error);
}

TEST(ConfigCheck, TheTreeCostPerLayerIsBoundedByItsConstant) {
  auto heap_for = [](int64_t layers) {
    ModelConfig c = tiny_with("num_hidden_layers", layers);
    malloc_trim(0);
    const size_t before = mallinfo2().uordblks;
    auto tree = AutoModelForCausalLM::from_config(c);
    return static_cast<int64_t>(mallinfo2().uordblks - before);
  };
  const int64_t per_layer = (heap_for(132) - heap_for(4)) / 128;
  std::cout << "module tree: " << per_layer << " bytes per layer (bound " << kModuleTreeBytesPerLayer << ")\n";
  EXPECT_LE(per_layer, kModuleTreeBytesPerLayer);
  EXPECT_GE(per_layer * 8, kModuleTreeBytesPerLayer);  // and the bound is not far off
}

TEST(ConfigCheck, LayoutCountsEqualTheEnumeratedLayout) {
  for (const std::string& arch : preset_architectures())
    for (const std::string& preset : preset_names(arch)) {
      ModelConfig c = make_preset_config(arch, preset);
      int64_t n = 0;
      const std::vector<ParamSpec> layout = checkpoint_layout(c);
      for (const ParamSpec& p : layout) n += numel(p.shape);
      const LayoutCounts counts = layout_counts(c);
      EXPECT_EQ(counts.total, n) << arch << "/" << preset;
      // embed_tokens, norm and (untied) lm_head outside the layers.
      EXPECT_EQ(static_cast<int64_t>(layout.size()) - counts.layer_tensors,
                c.tie_word_embeddings ? 2 : 3);
    }
}

}  // namespace
}  // namespace tp
