#include "tp/cli/common.h"

#include <sys/resource.h>

#include <algorithm>
#include <sstream>

#include "tp/training/adapter_files.h"

namespace tp::cli {

void add_model_flags(CLI::App& app, ModelFlags& flags) {
  app.add_option("--model", flags.model, "Hugging Face model directory (config.json + *.safetensors)")->required();
  app.add_option("--dtype", flags.dtype, "weight dtype: auto (config.json's torch_dtype), f32, bf16")
      ->capture_default_str();
  app.add_option("--tp-plan", flags.tp_plan, "\"auto\" or a JSON file/object merged over the shipped plan")
      ->capture_default_str();
  app.add_option("--tp-size", flags.tp_size, "tensor-parallel size (default: the number of ranks)");
  app.add_option("--ep-size", flags.ep_size,
                 "expert-parallel size (MoE models): each rank holds num_experts / ep_size experts; spans every rank, "
                 "tp-size divides it");
  app.add_option("--ep-plan", flags.ep_plan, "\"auto\" or a JSON file/object merged over the shipped ep plan")
      ->capture_default_str();
  app.add_flag("--json", flags.json, "print one JSON document");
}

void add_sequence_parallel_flag(CLI::App& app, ModelFlags& flags) {
  app.add_flag("--sequence-parallel", flags.sequence_parallel,
               "sequence parallelism: norms and residual adds on sequence shards, an all-gather along the sequence "
               "before each column-parallel block and a reduce-scatter after each row-parallel one instead of the "
               "all-reduces (less activation memory per rank; same results)");
}

std::optional<DType> parse_dtype_flag(const std::string& value) {
  if (value == "auto") return std::nullopt;
  if (value == "f32" || value == "float32") return DType::F32;
  if (value == "bf16" || value == "bfloat16") return DType::BF16;
  throw UsageError(fmt::format("--dtype '{}' is not supported; choose auto, f32 or bf16", value));
}

LoadOptions load_options(const ModelFlags& flags) {
  LoadOptions o;
  o.dtype = parse_dtype_flag(flags.dtype);
  o.distributed_config.tp_plan = flags.tp_plan;
  o.distributed_config.tp_size = flags.tp_size;
  o.distributed_config.ep_size = flags.ep_size;
  o.distributed_config.ep_plan = flags.ep_plan;
  o.distributed_config.enable_sequence_parallel = flags.sequence_parallel;
  return o;
}

void add_adapter_flag(CLI::App& app, std::string& adapter) {
  app.add_option("--adapter", adapter, "PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors)");
}

PretrainedModel load_model(const ModelFlags& flags, const std::string& adapter) {
  PretrainedModel model = AutoModelForCausalLM::from_pretrained(flags.model, load_options(flags));
  if (!adapter.empty()) training::load_adapter(model, adapter);  // the adapters live in the model's modules
  return model;
}

void add_sampling_flags(CLI::App& app, SamplingFlags& f) {
  app.add_option("--max-new-tokens", f.max_new_tokens, "tokens to generate per prompt")->capture_default_str();
  app.add_option("--temperature", f.temperature, "0: greedy; > 0: sample")->capture_default_str();
  app.add_option("--top-k", f.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  app.add_option("--top-p", f.top_p, "sample from the smallest set reaching this probability")->capture_default_str();
  app.add_option("--seed", f.seed, "sampling seed")->capture_default_str();
}

generation::SamplingOptions sampling_options(const SamplingFlags& f) {
  return {.temperature = f.temperature, .top_k = f.top_k, .top_p = f.top_p, .seed = f.seed};
}

std::vector<int64_t> parse_id_list(const std::string& text, const char* flag) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0)
      throw UsageError(fmt::format("{}: '{}' is not a token id (expected non-negative integers like 1,2,3)", flag, item));
    ids.push_back(v);
  }
  if (ids.empty()) throw UsageError(fmt::format("{}: no token ids given (expected e.g. 1,2,3)", flag));
  return ids;
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace tp::cli
