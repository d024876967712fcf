// `tp make-model`: writes a random-weight checkpoint with the exact config.json
// and tensor names of a real architecture, for tests and benchmarks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "tp/cli/command.h"
#include "tp/models/checkpoint.h"
#include "tp/models/mxfp4.h"
#include "tp/models/presets.h"

namespace tp::cli {

namespace {

namespace fs = std::filesystem;

struct Options {
  std::string arch, preset, dtype, tokenizer, out, max_shard = "5GB";
  int64_t layers = 0;
  uint64_t seed = 0;
  bool mxfp4 = false;
  std::vector<std::string> sets;
};

// GPT-OSS's expert weights, which MXFP4 checkpoints store as blocks and scales.
bool mxfp4_param(const std::string& name) {
  return name.ends_with(".mlp.experts.gate_up_proj") || name.ends_with(".mlp.experts.down_proj");
}

// `p` drawn in f32, quantised (tp/models/mxfp4.h): two sources, the quantisation run once for both.
void add_mxfp4_sources(const ParamSpec& p, double std, uint64_t seed, std::vector<io::TensorSource>& sources,
                       size_t& total) {
  auto q = std::make_shared<Mxfp4Tensors>();
  auto get = [p, std, seed, q]() -> const Mxfp4Tensors& {
    if (!q->blocks.defined()) *q = quantise_mxfp4(init_param(p, std, seed, DType::F32));
    return *q;
  };
  io::TensorSource b{p.name + "_blocks", DType::U8, mxfp4_blocks_shape(p.name, p.shape), {}, {}};
  b.fill = [get](void* dst) { std::memcpy(dst, get().blocks.raw_data(), get().blocks.nbytes()); };
  io::TensorSource s{p.name + "_scales", DType::U8, mxfp4_scales_shape(p.name, p.shape), {}, {}};
  s.fill = [get, q](void* dst) {
    std::memcpy(dst, get().scales.raw_data(), get().scales.nbytes());
    *q = {};  // both written: the memory goes
  };
  total += b.nbytes() + s.nbytes();
  sources.push_back(std::move(b));
  sources.push_back(std::move(s));
}

// --set key=value: value parsed as JSON when it is JSON (numbers, true, null,
// lists), else taken as a string.
std::string apply_set(nlohmann::json& raw, const std::string& kv) {
  auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError(fmt::format("--set '{}': expected key=value, e.g. num_key_value_heads=2", kv));
  std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
  try {
    raw[key] = nlohmann::json::parse(value);
  } catch (const nlohmann::json::exception&) {
    raw[key] = value;
  }
  return key;
}

// The preset's per-layer keys follow a new num_hidden_layers (from --layers or
// --set), unless --set gave them: layer_types repeats its pattern (GPT-OSS's
// sliding / full alternation), and a max_window_layers equal to the preset's
// layer count (Qwen's "no sliding layer") stays equal to it. A layer_types given
// with --set must list one type per layer.
void fit_per_layer_keys(nlohmann::json& raw, const nlohmann::json& preset, const std::set<std::string>& set_keys) {
  const nlohmann::json& n_json = raw["num_hidden_layers"];
  if (!n_json.is_number_integer() || n_json.get<int64_t>() < 1) return;  // the config's parser names the value
  const auto n = static_cast<size_t>(n_json.get<int64_t>());
  const nlohmann::json preset_n = preset.value("num_hidden_layers", nlohmann::json());
  if (auto it = raw.find("layer_types"); it != raw.end() && it->is_array() && it->size() != n) {
    if (set_keys.contains("layer_types") || it->empty())
      throw UsageError(fmt::format("--set layer_types: {} types for {} layers (num_hidden_layers); list one per layer",
                                   it->size(), n));
    nlohmann::json types = nlohmann::json::array();
    for (size_t i = 0; i < n; ++i) types.push_back((*it)[i % it->size()]);
    *it = std::move(types);
  }
  if (auto it = raw.find("max_window_layers");
      it != raw.end() && !set_keys.contains("max_window_layers") &&
      preset.value("max_window_layers", nlohmann::json()) == preset_n)
    *it = n;
}

// Every architecture's presets, for --help.
std::string preset_help() {
  std::vector<std::string> lines;
  for (const std::string& arch : preset_architectures())
    lines.push_back(fmt::format("{}: {}", arch, fmt::join(preset_names(arch), ", ")));
  return fmt::format("Preset ({})", fmt::join(lines, "; "));
}

DType model_dtype(const std::string& flag, const std::string& torch_dtype) {
  const std::string name = flag.empty() ? torch_dtype : flag;
  if (name == "f32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "f16" || name == "float16") return DType::F16;
  throw UsageError(fmt::format("--dtype '{}': supported: f32, bf16, f16", name));
}

const char* torch_dtype_name(DType d) {
  return d == DType::BF16 ? "bfloat16" : d == DType::F16 ? "float16" : "float32";
}

void copy_tokenizer(const fs::path& tokenizer, const fs::path& out) {
  TP_CHECK(fs::is_regular_file(tokenizer), "--tokenizer {}: no such file", tokenizer.string());
  fs::copy_file(tokenizer, out / "tokenizer.json", fs::copy_options::overwrite_existing);
  for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"}) {
    fs::path p = tokenizer.parent_path() / extra;
    if (fs::is_regular_file(p)) fs::copy_file(p, out / extra, fs::copy_options::overwrite_existing);
  }
}

int run(const Options& o) {
  auto start = std::chrono::steady_clock::now();
  ModelConfig base = make_preset_config(o.arch, o.preset);
  nlohmann::json raw = base.raw;
  if (o.layers > 0) raw["num_hidden_layers"] = o.layers;
  std::set<std::string> set_keys;
  for (const std::string& kv : o.sets) set_keys.insert(apply_set(raw, kv));
  fit_per_layer_keys(raw, base.raw, set_keys);
  if (o.mxfp4) {
    // What the Hub's gpt-oss checkpoints carry: everything but the experts stays unquantised.
    raw["quantization_config"] = {
        {"quant_method", "mxfp4"},
        {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                    "lm_head"}}};
  }
  DType dtype = model_dtype(o.dtype, raw.value("torch_dtype", "float32"));
  raw["torch_dtype"] = torch_dtype_name(dtype);
  ModelConfig config = ModelConfig::from_json(raw, fmt::format("preset {}/{} with overrides", o.arch, o.preset));

  std::vector<ParamSpec> layout = checkpoint_layout(config);
  if (o.mxfp4 && std::none_of(layout.begin(), layout.end(), [](const ParamSpec& p) { return mxfp4_param(p.name); }))
    throw UsageError(fmt::format("--mxfp4: only gpt_oss checkpoints have MXFP4 experts (this is {})",
                                 config.model_type));
  std::vector<io::TensorSource> sources;
  size_t total = 0;
  for (const ParamSpec& p : layout) {
    if (o.mxfp4 && mxfp4_param(p.name)) {
      add_mxfp4_sources(p, config.initializer_range, o.seed, sources, total);
      continue;
    }
    io::TensorSource s{p.name, dtype, p.shape, {}, {}};
    s.fill = [p, dtype, std = config.initializer_range, seed = o.seed](void* dst) {
      init_param_into(p, std, seed, dtype, dst);
    };
    total += s.nbytes();
    sources.push_back(std::move(s));
  }
  const fs::path out(o.out);
  size_t max_shard = 0;
  try {
    max_shard = io::parse_size(o.max_shard);
  } catch (const Error& e) {
    throw UsageError(fmt::format("--max-shard-size: {}", e.what()));
  }
  save_checkpoint(out, config, sources, max_shard);
  save_generation_config(out, config);
  if (!o.tokenizer.empty()) copy_tokenizer(o.tokenizer, out);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s %s, %lld layers, %zu tensors, %.1f MB %s, seed %llu (%.1f s)\n", out.c_str(),
              o.arch.c_str(), o.preset.c_str(), static_cast<long long>(config.num_hidden_layers), sources.size(),
              total / 1e6, dtype_name(dtype), static_cast<unsigned long long>(o.seed), secs);
  return 0;
}

Registrar reg("make-model", "Write a random-weight checkpoint of a real architecture (config.json + safetensors)",
              [](CLI::App& sub) -> RunFn {
                auto o = std::make_shared<Options>();
                sub.add_option("--arch", o->arch,
                               fmt::format("Architecture: {}", fmt::join(preset_architectures(), ", ")))
                    ->required();
                sub.add_option("--preset", o->preset, preset_help())->required();
                sub.add_option("--layers", o->layers, "Override num_hidden_layers")->check(CLI::PositiveNumber);
                sub.add_option("--dtype", o->dtype, "Weight dtype: f32, bf16, f16 (default: the preset's torch_dtype)");
                sub.add_option("--seed", o->seed, "Random seed (default 0)");
                sub.add_flag("--mxfp4", o->mxfp4,
                             "gpt_oss: store the expert weights as MXFP4 blocks and scales (dequantised at load)");
                sub.add_option("--tokenizer", o->tokenizer,
                               "tokenizer.json to copy (tokenizer_config.json next to it is copied too)");
                sub.add_option("--max-shard-size", o->max_shard, "Shard weights above this size (default 5GB)");
                sub.add_option("--set", o->sets, "Override a config.json key: key=value (repeatable)");
                sub.add_option("--out", o->out, "Output directory")->required();
                return [o] { return run(*o); };
              });

}  // namespace

}  // namespace tp::cli
