#pragma once
// Flags and helpers shared by the model subcommands (--model, --dtype, --tp-plan, --json).
#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tp/generation/sampling.h"
#include "tp/models/auto.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp::cli {

struct ModelFlags {
  std::string model;
  std::string dtype = "auto";
  std::string tp_plan = "auto";
  std::optional<int64_t> tp_size;
  std::optional<int64_t> ep_size;
  std::string ep_plan = "auto";
  bool sequence_parallel = false;
  bool json = false;
};

// Adds --model (required), --dtype, --tp-plan, --tp-size, --ep-size, --ep-plan and --json.
void add_model_flags(CLI::App& app, ModelFlags& flags);
// Adds --sequence-parallel (DistributedConfig::enable_sequence_parallel).
void add_sequence_parallel_flag(CLI::App& app, ModelFlags& flags);
// auto -> unset (config.json's torch_dtype); f32, bf16. Errors list the choices.
std::optional<DType> parse_dtype_flag(const std::string& value);
LoadOptions load_options(const ModelFlags& flags);
// --adapter DIR: a PEFT LoRA adapter directory applied on top of --model.
void add_adapter_flag(CLI::App& app, std::string& adapter);
// from_pretrained with the flags, and the adapter when one is given.
PretrainedModel load_model(const ModelFlags& flags, const std::string& adapter = "");

// --max-new-tokens, --temperature, --top-k, --top-p, --seed (tp generate, tp chat).
struct SamplingFlags {
  int64_t max_new_tokens = 32;
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
};
void add_sampling_flags(CLI::App& app, SamplingFlags& flags);
generation::SamplingOptions sampling_options(const SamplingFlags& flags);

// "1,2,3" -> {1, 2, 3}; errors (UsageError) name the bad item.
std::vector<int64_t> parse_id_list(const std::string& text, const char* flag);

// Peak resident memory of this process in bytes (getrusage).
int64_t peak_rss_bytes();

}  // namespace tp::cli
