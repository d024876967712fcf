// What users see: `tp make-model` and `tp inspect` exit codes, messages and
// files. The tp binary's path comes from CMake (TP_BINARY).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "io/bad_checkpoints.h"
#include "tp/models/checkpoint.h"
#include "tp/models/presets.h"

namespace tp::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int code;
  std::string out;  // stdout and stderr
};

Result run(const std::string& args) {
  std::string cmd = std::string(TP_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tp_test_cli_" + name);
  fs::remove_all(d);
  return d;
}

TEST(Cli, InspectFailsWithExitOneOnEveryBadCheckpoint) {
  auto cases = testing::make_bad_checkpoints(temp_dir("bad"));
  for (const testing::BadCase& bc : cases) {
    Result r = run("inspect --model " + bc.dir.string() + (bc.needs_verify ? " --verify" : ""));
    EXPECT_EQ(r.code, 1) << bc.name << ": " << r.out;
    EXPECT_NE(r.out.find("[rank 0] error: "), std::string::npos) << bc.name << ": " << r.out;
    EXPECT_NE(r.out.find(bc.bad_file.string()), std::string::npos) << bc.name << ": " << r.out;
    EXPECT_NE(r.out.find(bc.expected), std::string::npos) << bc.name << ": " << r.out;
    if (!bc.tensor.empty()) {
      EXPECT_NE(r.out.find("'" + bc.tensor + "'"), std::string::npos) << bc.name << ": " << r.out;
    }
  }
  // Without --verify the NaN checkpoint is structurally fine.
  for (const testing::BadCase& bc : cases) {
    if (bc.needs_verify) {
      EXPECT_EQ(run("inspect --model " + bc.dir.string()).code, 0) << bc.name;
    }
  }
}

TEST(Cli, MakeModelQwen3_0_6bOneLayerWritesTheHubLayout) {
  fs::path dir = temp_dir("qwen3");
  Result r = run("make-model --arch qwen3 --preset qwen3-0.6b --layers 1 --dtype bf16 --seed 3 --out " + dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  // Hand-written from the Hub's Qwen/Qwen3-0.6B (layer 0 of 28; tied, so no lm_head).
  const std::map<std::string, Shape> expected = {
      {"model.embed_tokens.weight", {151936, 1024}},
      {"model.layers.0.input_layernorm.weight", {1024}},
      {"model.layers.0.mlp.down_proj.weight", {1024, 3072}},
      {"model.layers.0.mlp.gate_proj.weight", {3072, 1024}},
      {"model.layers.0.mlp.up_proj.weight", {3072, 1024}},
      {"model.layers.0.post_attention_layernorm.weight", {1024}},
      {"model.layers.0.self_attn.k_norm.weight", {128}},
      {"model.layers.0.self_attn.k_proj.weight", {1024, 1024}},
      {"model.layers.0.self_attn.o_proj.weight", {1024, 2048}},
      {"model.layers.0.self_attn.q_norm.weight", {128}},
      {"model.layers.0.self_attn.q_proj.weight", {2048, 1024}},
      {"model.layers.0.self_attn.v_proj.weight", {1024, 1024}},
      {"model.norm.weight", {1024}},
  };
  Result ins = run("inspect --json --verify --model " + dir.string());
  ASSERT_EQ(ins.code, 0) << ins.out;
  json j = json::parse(ins.out);
  std::map<std::string, Shape> got;
  for (const json& t : j["tensors"]) {
    got[t["name"]] = t["shape"].get<Shape>();
    EXPECT_EQ(t["dtype"], "BF16");
    EXPECT_EQ(t["file"], "model.safetensors");
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(j["parameters"], 155582464 + 15730944 + 1024);  // embedding + one layer + final norm
  EXPECT_EQ(j["files"][0]["metadata"]["format"], "pt");
  json cfg = json::parse(std::ifstream(dir / "config.json"));
  EXPECT_EQ(cfg["architectures"], json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(cfg["num_hidden_layers"], 1);
  EXPECT_EQ(cfg["head_dim"], 128);
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["base_model_tp_plan"]["layers.*.self_attn.q_norm"], "replicated_with_grad_allreduce");
  json gen = json::parse(std::ifstream(dir / "generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], 151645);
  // Weights as Transformers initializes them, from the seed.
  Checkpoint ck = Checkpoint::open(dir);
  ParamSpec up{"model.layers.0.mlp.up_proj.weight", {3072, 1024}, ParamSpec::Init::Normal};
  EXPECT_TRUE(equal(ck.read(up.name), init_param(up, 0.02, 3, DType::BF16)));
  EXPECT_TRUE(equal(ck.read("model.layers.0.self_attn.q_norm.weight"), Tensor::full({128}, 1.0, DType::BF16)));
  fs::remove_all(dir);
}

TEST(Cli, MakeModelShardsTokenizerAndOverrides) {
  fs::path dir = temp_dir("llama"), tok = temp_dir("tok");
  fs::create_directories(tok);
  std::ofstream(tok / "tokenizer.json") << R"({"model": {"type": "BPE"}})";
  std::ofstream(tok / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  Result r = run("make-model --arch llama --preset tiny --max-shard-size 300KB --set num_key_value_heads=2 --tokenizer " +
                 (tok / "tokenizer.json").string() + " --out " + dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir / "tokenizer_config.json"));
  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_TRUE(ck.sharded());
  EXPECT_EQ(ck.config().num_key_value_heads, 2);
  EXPECT_EQ(ck.info("model.layers.0.self_attn.k_proj.weight").shape, (Shape{16, 192}));
  Result ins = run("inspect --model " + dir.string());
  EXPECT_EQ(ins.code, 0);
  EXPECT_NE(ins.out.find("sharded with model.safetensors.index.json"), std::string::npos) << ins.out;
  EXPECT_NE(ins.out.find("lm_head.weight"), std::string::npos);
  fs::remove_all(dir);
  fs::remove_all(tok);
}

TEST(Cli, UsageErrorsExitTwoAndNameTheValue) {
  fs::remove_all("/tmp/tp_never");
  Result r = run("make-model --arch llama --preset huge --out /tmp/tp_never");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown preset 'huge' for architecture llama; supported: llama-2-7b, llama-3-8b, llama-3.2-1b, tiny"),
            std::string::npos)
      << r.out;
  r = run("make-model --arch llama --preset tiny --dtype f8 --out /tmp/tp_never");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--dtype 'f8'"), std::string::npos) << r.out;
  r = run("make-model --arch llama --preset tiny --set num_key_value_heads=5 --out /tmp/tp_never");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("num_attention_heads (24) is not a multiple of num_key_value_heads (5)"), std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists("/tmp/tp_never"));
  r = run("inspect");
  EXPECT_EQ(r.code, 2);
  r = run("inspect --model /nonexistent/dir");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/dir"), std::string::npos);
}

}  // namespace
}  // namespace tp::io
