#include "io/bad_checkpoints.h"

#include <cmath>
#include <fstream>

#include "tp/models/checkpoint.h"
#include "tp/models/presets.h"

namespace tp::io::testing {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// llama, 1 layer: hidden 8, 2 heads of 4, 1 kv head, intermediate 16, vocab 10.
json small_config(int layers) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 8},
          {"intermediate_size", 16},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"vocab_size", 10},
          {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-5},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"}};
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

void write_raw_safetensors(const fs::path& file, const std::string& header, size_t data_bytes,
                           long long declared_len) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  uint64_t n = declared_len >= 0 ? static_cast<uint64_t>(declared_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header;
  out << std::string(data_bytes, '\0');
}

void write_valid_checkpoint(const fs::path& dir, int layers) {
  ModelConfig c = ModelConfig::from_json(small_config(layers), "test config");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamSpec& p : checkpoint_layout(c)) tensors.emplace_back(p.name, init_param(p, 0.02, 1, DType::F32));
  save_checkpoint(dir, c, tensors);
}

std::vector<BadCase> make_bad_checkpoints(const fs::path& root) {
  fs::remove_all(root);
  fs::create_directories(root);
  std::vector<BadCase> cases;
  // A directory with a valid config and `header` as model.safetensors.
  auto file_case = [&](const std::string& name, const std::string& header, size_t data, std::string expected,
                       std::string tensor = "", long long declared = -1) {
    fs::path dir = root / name;
    fs::create_directories(dir);
    write_text(dir / "config.json", small_config(1).dump());
    write_raw_safetensors(dir / "model.safetensors", header, data, declared);
    cases.push_back({name, dir, dir / "model.safetensors", std::move(expected), std::move(tensor)});
  };
  const std::string ok_entry = R"("w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})";

  {
    fs::path dir = root / "truncated";
    fs::create_directories(dir);
    write_text(dir / "config.json", small_config(1).dump());
    write_text(dir / "model.safetensors", "abcde");
    cases.push_back({"truncated", dir, dir / "model.safetensors", "shorter than the 8-byte header", ""});
  }
  file_case("header_past_eof", "{" + ok_entry + "}", 24, "runs past the end of the file", "", 5000);
  file_case("header_absurd", "{" + ok_entry + "}", 24, "larger than the", "", 1ll << 50);
  file_case("bad_json", R"({"w": {"dtype": "F32", "shape": [2, 3], )", 24, "not valid JSON");
  file_case("non_utf8", "{\"w\xff\xfe\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}", 24,
            "not valid JSON");
  file_case("not_object", R"([1, 2, 3])", 24, "does not start with '{'");
  file_case("entry_not_object", R"({"w": 5})", 24, "entry must be an object", "w");
  file_case("unknown_dtype", R"({"w": {"dtype": "F64", "shape": [2, 3], "data_offsets": [0, 48]}})", 48,
            "unknown or unsupported dtype 'F64'; accepted: F32, BF16, F16, I32, I64, U8", "w");
  file_case("shape_mismatch", R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24,
            "needs 24 bytes", "w");
  file_case("begin_after_end", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [16, 8]}})", 24,
            "begin > end", "w");
  file_case("outside_data", R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 32]}})", 24,
            "outside the data area", "w");
  file_case("overlap",
            R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
            24, "overlap", "b");
  file_case("bad_metadata", R"({"__metadata__": {"format": 1}, )" + ok_entry + "}", 24, "__metadata__");

  // Sharded directories whose index is wrong.
  {
    fs::path dir = root / "index_missing_file";
    write_valid_checkpoint(dir);
    fs::path single = dir / "model.safetensors";
    fs::rename(single, dir / "model-00001-of-00002.safetensors");
    json weight_map = json::object();
    for (const ParamSpec& p : checkpoint_layout(ModelConfig::load(dir / "config.json")))
      weight_map[p.name] = "model-00001-of-00002.safetensors";
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors";
    write_text(dir / "model.safetensors.index.json", json{{"metadata", {{"total_size", 1}}}, {"weight_map", weight_map}}.dump());
    cases.push_back({"index_missing_file", dir, dir / "model.safetensors.index.json", "does not exist",
                     "model.norm.weight"});
  }
  {
    fs::path dir = root / "index_tensor_absent";
    write_valid_checkpoint(dir);
    fs::rename(dir / "model.safetensors", dir / "model-00001-of-00001.safetensors");
    json weight_map = json::object();
    for (const ParamSpec& p : checkpoint_layout(ModelConfig::load(dir / "config.json")))
      weight_map[p.name] = "model-00001-of-00001.safetensors";
    weight_map["model.layers.7.mlp.up_proj.weight"] = "model-00001-of-00001.safetensors";
    write_text(dir / "model.safetensors.index.json", json{{"weight_map", weight_map}}.dump());
    cases.push_back({"index_tensor_absent", dir, dir / "model-00001-of-00001.safetensors", "has no such tensor",
                     "model.layers.7.mlp.up_proj.weight"});
  }

  // Configs that are incomplete, contradictory, or contradict the weights.
  auto config_case = [&](const std::string& name, json config, std::string expected, std::string tensor = "") {
    fs::path dir = root / name;
    write_valid_checkpoint(dir);
    write_text(dir / "config.json", config.dump());
    cases.push_back({name, dir, dir / "config.json", std::move(expected), std::move(tensor)});
  };
  json c = small_config(1);
  c.erase("hidden_size");
  config_case("config_missing_key", c, "required key 'hidden_size' is missing");
  c = small_config(1);
  c["hidden_size"] = 9;
  config_case("config_heads_not_dividing", c, "hidden_size (9) is not a multiple of num_attention_heads (2)");
  c = small_config(1);
  c["num_attention_heads"] = 3;
  c["head_dim"] = 4;
  c["num_key_value_heads"] = 2;
  config_case("config_kv_not_dividing", c, "num_attention_heads (3) is not a multiple of num_key_value_heads (2)");
  c = small_config(1);
  c["intermediate_size"] = 12;
  config_case("config_contradicts_weights", c, "'intermediate_size' is 12 but the weights have 16",
              "model.layers.0.mlp.gate_proj.weight");
  c = small_config(2);
  config_case("config_more_layers_than_weights", c, "'num_hidden_layers' is 2 but the weights in");
  c = small_config(1);
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  config_case("config_rope_incomplete", c, "needs 'low_freq_factor'");
  c = small_config(1);
  c["rope_scaling"] = {{"rope_type", "dynamo"}, {"factor", 8.0}};
  config_case("config_rope_unknown", c, "unsupported rope_type 'dynamo'; supported: default, linear, llama3, yarn");
  {
    fs::path dir = root / "config_bad_json";
    write_valid_checkpoint(dir);
    write_text(dir / "config.json", "{\"model_type\": \"llama\",");
    cases.push_back({"config_bad_json", dir, dir / "config.json", "not valid JSON", ""});
  }

  // Valid files whose data holds a NaN: only reading the data finds it.
  {
    fs::path dir = root / "nan_weights";
    ModelConfig cfg = ModelConfig::from_json(small_config(1), "test config");
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const ParamSpec& p : checkpoint_layout(cfg)) {
      Tensor t = init_param(p, 0.02, 1, DType::BF16);
      if (p.name == "model.layers.0.mlp.down_proj.weight") t.data<bf16>()[5] = to_bf16(NAN);
      tensors.emplace_back(p.name, t);
    }
    save_checkpoint(dir, cfg, tensors);
    BadCase bc{"nan_weights", dir, dir / "model.safetensors", "NaN/Inf values (first at flat index 5)",
               "model.layers.0.mlp.down_proj.weight"};
    bc.needs_verify = true;
    cases.push_back(bc);
  }
  return cases;
}

}  // namespace tp::io::testing
