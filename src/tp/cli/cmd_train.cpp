// tp train: fine-tune a Hugging Face checkpoint with tensor parallelism.
//   tprun --nproc-per-node N tp train --model DIR --data FILE... [--output-dir OUT] ...
// Every rank runs the same steps on the same batches; rank 0 shows the progress,
// writes the log history (JSON lines), the loss curve (PNG) and the trained
// model (Hugging Face files) into the output directory.
#include <filesystem>
#include <iostream>
#include <memory>

#include "tp/cli/command.h"
#include "tp/cli/common.h"
#include "tp/distributed/parallelism_config.h"
#include "tp/models/checkpoint.h"
#include "tp/ops/gemm.h"
#include "tp/training/lora_training.h"
#include "tp/training/memory_estimate.h"
#include "tp/training/loss_plot.h"
#include "tp/training/progress.h"
#include "tp/training/trainer.h"

namespace tp::cli {
namespace {

namespace fs = std::filesystem;
using training::TrainingArguments;

struct TrainFlags {
  ModelFlags model;
  std::vector<std::string> data, eval_data;
  std::string sample_by = "line";
  std::optional<int64_t> seq_len;
  TrainingArguments args;
  std::optional<int64_t> eval_steps;
  std::optional<int64_t> save_total_limit;
  std::string resume;
  bool no_loss_parallel = false;
  bool no_save_model = false;
  std::optional<int64_t> dp_replicate_size, dp_shard_size;
  std::optional<double> ddp_bucket_cap_mb;
  std::string gradient_checkpointing_kwargs;
  std::string fsdp_config;
  bool estimate_memory = false;
  // LoRA: on when any --lora-* flag is given; PEFT's defaults for the rest.
  std::optional<int64_t> lora_r;
  std::optional<double> lora_alpha, lora_dropout;
  std::vector<std::string> lora_target;
  bool use_rslora = false;
  bool lora() const { return lora_r || lora_alpha || lora_dropout || !lora_target.empty() || use_rslora; }
  training::LoraConfig lora_config(const fs::path& base) const {
    training::LoraConfig c;
    c.r = lora_r.value_or(c.r);
    c.lora_alpha = lora_alpha.value_or(c.lora_alpha);
    c.lora_dropout = lora_dropout.value_or(c.lora_dropout);
    c.target_modules = lora_target;
    c.use_rslora = use_rslora;
    c.base_model_name_or_path = base.string();
    return c;
  }
};

std::shared_ptr<training::TokenBlocks> load_blocks(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                                                   const training::TextDataOptions& options) {
  std::vector<fs::path> paths(files.begin(), files.end());
  return std::make_shared<training::TokenBlocks>(training::TokenBlocks::from_files(paths, tokenizer, options));
}

// Ranks on this machine (tprun's LOCAL_WORLD_SIZE; every rank when not launched by it).
int64_t local_world_size() {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (local != nullptr) {
    try {
      return std::max<int64_t>(1, std::stoll(local));
    } catch (const std::exception&) {
    }
  }
  return dist::world_size();
}

// What a step will hold per rank, from config.json and the flags (full
// fine-tuning without expert parallelism; LoRA holds less): unset when it cannot
// be estimated (the reason is printed) unless --estimate-memory asked for it.
std::optional<training::MemoryEstimate> estimate_memory(const TrainFlags& f, const ModelConfig& config,
                                                        int64_t seq_len, bool quiet,
                                                        training::MemoryEstimateInputs* inputs) {
  const TrainingArguments& a = f.args;
  training::MemoryEstimateInputs& mem = *inputs;
  mem.config = config;
  const int64_t dp_replicate = f.dp_replicate_size.value_or(1), dp_shard = f.dp_shard_size.value_or(1);
  if (dp_replicate < 1 || dp_shard < 1 || f.model.tp_size.value_or(1) < 1) {
    if (f.estimate_memory)
      throw UsageError(fmt::format("--dp-replicate-size {}, --dp-shard-size {}, --tp-size {}: parallelism sizes must "
                                   "be >= 1", dp_replicate, dp_shard, f.model.tp_size.value_or(1)));
    return std::nullopt;  // the mesh's sizes are checked (and named) when it is built
  }
  const int64_t dp = dp_replicate * dp_shard;
  mem.distributed.tp_size = f.model.tp_size.value_or(std::max<int64_t>(1, dist::world_size() / dp));
  mem.distributed.tp_plan = f.model.tp_plan;
  mem.distributed.enable_sequence_parallel = f.model.sequence_parallel;
  mem.dp_shard_size = f.dp_shard_size.value_or(1);
  mem.fsdp = a.fsdp_options().enabled;
  mem.fsdp_reshard_after_forward = a.fsdp_options().reshard_after_forward;
  mem.seq_len = seq_len;
  mem.batch_size = a.per_device_train_batch_size;
  mem.bf16 = a.bf16;
  mem.bf16_native = ops::detail::bf16_gemm_native();
  mem.optim = a.optim;
  mem.checkpointing = a.checkpointing();
  mem.fused_loss = a.loss_parallel || *mem.distributed.tp_size == 1;
  try {
    TP_CHECK(!f.lora() && f.model.ep_size.value_or(1) == 1,
             "--estimate-memory covers full fine-tuning without expert parallelism, not LoRA or --ep-size");
    return training::estimate_training_memory(mem);
  } catch (const Error& e) {
    if (f.estimate_memory) throw;
    if (!quiet) fmt::print(stderr, "memory: not estimated: {}\n", e.what());
  }
  return std::nullopt;
}

int run_train(TrainFlags& f) {
  const fs::path dir = f.model.model;
  TrainingArguments& a = f.args;
  a.eval_steps = f.eval_steps;
  a.save_total_limit = f.save_total_limit;
  a.loss_parallel = !f.no_loss_parallel;
  a.ddp_bucket_cap_mb = f.ddp_bucket_cap_mb;
  if (!f.gradient_checkpointing_kwargs.empty()) {
    try {
      a.gradient_checkpointing_kwargs = nlohmann::json::parse(f.gradient_checkpointing_kwargs);
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(fmt::format("--gradient-checkpointing-kwargs is not JSON ({}): {}",
                                   f.gradient_checkpointing_kwargs, e.what()));
    }
  }
  if (!f.fsdp_config.empty()) {
    try {
      a.fsdp_config = nlohmann::json::parse(f.fsdp_config);
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(fmt::format("--fsdp-config is not JSON ({}): {}", f.fsdp_config, e.what()));
    }
  }
  if (!f.eval_data.empty()) a.eval_strategy = "steps";
  std::optional<DType> dtype = parse_dtype_flag(f.model.dtype);
  try {
    a.validate();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }

  // Everything that can be checked before the model is read: config, tokenizer, data.
  TP_CHECK(fs::is_directory(dir), "--model {} is not a directory", dir.string());
  const ModelConfig config = Checkpoint::open(dir).config();  // the config against the weights' headers
  training::TextDataOptions data_options;
  data_options.sample_by = f.sample_by;
  data_options.seq_len = f.seq_len.value_or(
      config.max_position_embeddings > 0 ? std::min<int64_t>(1024, config.max_position_embeddings) : 1024);
  TP_CHECK(config.max_position_embeddings <= 0 || data_options.seq_len <= config.max_position_embeddings,
           "--seq-len {} is above the model's max_position_embeddings {} ({})", data_options.seq_len,
           config.max_position_embeddings, (dir / "config.json").string());
  if (!dtype) dtype = config.torch_dtype == "bfloat16" ? DType::BF16 : DType::F32;
  a.bf16 = *dtype == DType::BF16;
  const bool rank0 = dist::world_rank() == 0;
  training::MemoryEstimateInputs mem;
  const std::optional<training::MemoryEstimate> estimate =
      estimate_memory(f, config, data_options.seq_len, !rank0 || f.model.json, &mem);
  if (f.estimate_memory) {
    if (rank0) {
      if (f.model.json) {
        std::cout << estimate->to_json().dump() << "\n";
      } else {
        training::print_memory_estimate(std::cout, *estimate);
      }
    }
    return 0;
  }
  if (estimate) {
    if (rank0 && !f.model.json) training::print_memory_estimate(std::cerr, *estimate);
    training::check_memory_fits(mem, *estimate, local_world_size());  // before any weight is read
  }
  if (f.data.empty()) throw UsageError("--data is required (training text)");
  TP_CHECK(fs::exists(dir / "tokenizer.json"),
           "{} has no tokenizer.json: tp train tokenizes --data with the model's tokenizer", dir.string());
  Tokenizer tokenizer = Tokenizer::from_model_dir(dir);
  auto train = load_blocks(f.data, tokenizer, data_options);
  std::shared_ptr<training::TokenBlocks> eval;
  if (!f.eval_data.empty()) eval = load_blocks(f.eval_data, tokenizer, data_options);

  // The mesh dp_replicate x dp_shard x tp (accelerate's ParallelismConfig); the model uses its "tp" dim.
  // With --ep-size the model makes its own mesh (ep_replicas x tp, flattened ep) and there is no data parallelism.
  const int64_t ep_size = f.model.ep_size.value_or(1);
  if (ep_size > 1 && (f.dp_replicate_size.value_or(1) > 1 || f.dp_shard_size.value_or(1) > 1))
    throw UsageError("--ep-size with --dp-replicate-size / --dp-shard-size: expert parallelism with data "
                     "parallelism is not supported (use one of them)");
  if (a.fsdp_options().enabled && f.dp_shard_size.value_or(1) < 2)
    throw UsageError(fmt::format("--fsdp {} shards over --dp-shard-size, which is {}: give it 2 or more ranks "
                                 "(--dp-shard-size N)", a.fsdp, f.dp_shard_size.value_or(1)));
  const dist::ParallelismConfig parallelism{f.dp_replicate_size, f.dp_shard_size, f.model.tp_size};
  LoadOptions load = LoadOptions::for_training();
  load.distributed_config.tp_plan = f.model.tp_plan;
  load.distributed_config.enable_sequence_parallel = f.model.sequence_parallel;
  std::string layout;
  if (ep_size > 1) {
    load.distributed_config.tp_size = f.model.tp_size;
    load.distributed_config.ep_size = ep_size;
    load.distributed_config.ep_plan = f.model.ep_plan;
    layout = fmt::format("ep {} x tp {}", ep_size, f.model.tp_size.value_or(ep_size));
  } else {
    dist::ParallelismConfig sizes;
    try {
      sizes = parallelism.resolved(dist::world_size());
    } catch (const Error& e) {
      throw UsageError(fmt::format("--dp-replicate-size / --dp-shard-size / --tp-size: {}", e.what()));
    }
    load.distributed_config.tp_size = sizes.tp_size;
    load.mesh = parallelism.build_device_mesh();
    layout = sizes.to_string();
  }
  PretrainedModel model = AutoModelForCausalLM::from_pretrained(dir, load);
  std::optional<training::LoraModel> lora;
  training::TrainerOptions options;
  if (f.lora()) {
    const training::LoraConfig config = f.lora_config(dir);
    try {
      config.validate("--lora-*");
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    lora = training::apply_lora(model, config, training::peft_init(static_cast<uint64_t>(a.seed)));
    options = training::adapter_training(model, *lora);
  }
  training::Trainer trainer(model, a, train, eval, options);
  if (rank0 && !f.model.json)
    fmt::print(stderr,
               "training {} ({} {}parameters) on {} rank(s) ({}): {} blocks of {} tokens from {} documents ({} "
               "tokens past the last whole block dropped), {} steps, {} compute, {} loss, {} MiB of optimizer state "
               "per rank\n",
               dir.string(), [&] {
                 int64_t n = 0;
                 for (const auto& p : trainer.parameters().params()) n += numel(p.global_shape);
                 return n;
               }(),
               lora ? fmt::format("LoRA (r={} on {}) ", lora->config().r,
                                  fmt::join(lora->config().targets_for(model.lm().default_lora_targets(), model.config().model_type), ","))
                    : std::string(),
               dist::world_size(),
               trainer.parameters().fully_sharded() ? fmt::format("{}, fsdp={}", layout, a.fsdp) : layout, train->size(), train->seq_len(), train->documents(),
               train->dropped_tokens(), trainer.state().max_steps, a.bf16 ? "bf16 (f32 master weights)" : "f32",
               trainer.loss_parallel() ? "vocab-parallel" : "gathered-logits",
               trainer.optimizer().state_bytes() >> 20);
  const int64_t tokens_per_step =
      a.per_device_train_batch_size * a.gradient_accumulation_steps * trainer.dp_size() * train->seq_len();
  trainer.add_callback(std::make_shared<training::ProgressCallback>(rank0 && !f.model.json, tokens_per_step));
  auto logger = std::make_shared<training::JsonLinesLogger>(rank0, fs::path(a.output_dir) / "log_history.jsonl");
  trainer.add_callback(logger);

  training::TrainOutput out = trainer.train(f.resume);
  if (!f.no_save_model) trainer.save_model();

  if (!rank0) return 0;
  const fs::path png = fs::path(a.output_dir) / "loss_curve.png";
  std::string why_not;
  const bool plotted =
      training::plot_loss_curve(trainer.state().log_history, png, fmt::format("tp train: {}", dir.filename().string()),
                                &why_not);
  if (f.model.json) {
    nlohmann::json j = out.metrics;
    j["global_step"] = out.global_step;
    j["tp_size"] = model.tp_size();
    j["ep_size"] = model.ep_size();
    j["dp_replicate_size"] = trainer.dp_size() > 1 ? model.mesh().size("dp_replicate") : 1;
    j["dp_shard_size"] = trainer.dp_size() > 1 ? model.mesh().size("dp_shard") : 1;
    j["optimizer_state_bytes_per_rank"] = trainer.optimizer().state_bytes();
    j["output_dir"] = a.output_dir;
    j["log_history"] = logger->file().string();
    j["loss_curve"] = plotted ? nlohmann::json(png.string()) : nlohmann::json(nullptr);
    std::cout << j.dump() << "\n";
  } else {
    fmt::print(stderr, "trained {} steps: train_loss {:.4f}, {:.0f} tokens/s; model saved to {}\n", out.global_step,
               out.training_loss, out.metrics["train_tokens_per_second"].get<double>(),
               f.no_save_model ? std::string("(not saved)") : a.output_dir + (lora ? " (the PEFT adapter)" : ""));
    fmt::print(stderr, "log history: {}\n", logger->file().string());
    if (plotted) fmt::print(stderr, "loss curve: {}\n", png.string());
  }
  if (!plotted) fmt::print(stderr, "warning: no loss curve: {}\n", why_not);
  return 0;
}

Registrar reg("train", "Train (fine-tune) a model on text files with tensor parallelism", [](CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  TrainingArguments& a = f->args;
  add_model_flags(app, f->model);
  add_sequence_parallel_flag(app, f->model);
  app.get_option("--dtype")->description(
      "compute: auto (config.json's torch_dtype), f32, or bf16 (bf16 GEMM operands; f32 master weights, gradients "
      "and optimizer state)");
  app.add_option("--data", f->data, "training text: plain text, or JSON lines ({\"text\": ...}) for *.jsonl/*.json "
                 "(required unless --estimate-memory)");
  app.add_option("--eval-data", f->eval_data, "evaluation text (eval loss and perplexity every --eval-steps)");
  app.add_option("--sample-by", f->sample_by, "plain text documents: line, paragraph or document")
      ->capture_default_str();
  app.add_option("--seq-len", f->seq_len, "tokens per block (default: min(1024, max_position_embeddings))");
  app.add_option("--output-dir", a.output_dir, "checkpoints, logs, loss curve and the trained model")
      ->capture_default_str();
  auto* steps = app.add_option("--max-steps", a.max_steps, "optimizer steps (overrides --num-train-epochs)");
  app.add_option("--num-train-epochs", a.num_train_epochs, "epochs over the data")->capture_default_str()
      ->excludes(steps);
  app.add_option("--batch-size", a.per_device_train_batch_size, "blocks per micro-batch")->capture_default_str();
  app.add_option("--eval-batch-size", a.per_device_eval_batch_size, "blocks per eval batch")->capture_default_str();
  app.add_option("--grad-accum", a.gradient_accumulation_steps, "micro-batches per optimizer step")
      ->capture_default_str();
  app.add_option("--lr", a.learning_rate, "peak learning rate")->capture_default_str();
  app.add_option("--lr-scheduler", a.lr_scheduler_type, "linear, cosine or constant")->capture_default_str();
  app.add_option("--warmup-steps", a.warmup_steps, "warmup steps (a value below 1 is a fraction of the steps)")
      ->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay (not on biases and norms)")
      ->capture_default_str();
  app.add_option("--max-grad-norm", a.max_grad_norm, "clip the global gradient norm (0: off)")->capture_default_str();
  app.add_option("--optim", a.optim, "adamw_torch or sgd")->capture_default_str();
  app.add_option("--optim-args", a.optim_args, "e.g. momentum=0.9 for sgd");
  app.add_option("--adam-beta1", a.adam_beta1)->capture_default_str();
  app.add_option("--adam-beta2", a.adam_beta2)->capture_default_str();
  app.add_option("--adam-epsilon", a.adam_epsilon)->capture_default_str();
  app.add_option("--seed", a.seed, "data order seed")->capture_default_str();
  app.add_option("--logging-steps", a.logging_steps, "log every N steps")->capture_default_str();
  app.add_flag("--logging-first-step", a.logging_first_step, "also log the first step");
  app.add_option("--eval-steps", f->eval_steps, "evaluate every N steps (default: --logging-steps)");
  app.add_option("--save-steps", a.save_steps, "write output-dir/checkpoint-N every N steps")->capture_default_str();
  app.add_option("--save-total-limit", f->save_total_limit, "keep only the newest N checkpoints");
  app.add_option("--resume-from-checkpoint", f->resume, "a checkpoint directory, or 'last'");
  app.add_flag("--no-loss-parallel", f->no_loss_parallel, "gather the logits for the loss (as Transformers does)");
  app.add_flag("--no-save-model", f->no_save_model, "do not write the trained model into --output-dir");
  app.add_option("--dp-replicate-size", f->dp_replicate_size,
                 "data-parallel replicas (default: ranks / (tp-size x dp-shard-size))");
  app.add_option("--dp-shard-size", f->dp_shard_size,
                 "data-parallel ranks that shard the optimizer state between them (ZeRO-1/2; with --fsdp, "
                 "also the parameters and gradients; default 1)");
  app.add_option("--fsdp", a.fsdp, "shard parameters, gradients and optimizer state over --dp-shard-size: "
                 "full_shard (free a layer's weights after its forward) or shard_grad_op (keep them to the backward)")
      ->expected(0, 1)
      ->default_str("full_shard");
  app.add_option("--fsdp-config", f->fsdp_config, "JSON: {\"reshard_after_forward\": true | false}");
  app.add_option("--ddp-bucket-cap-mb", f->ddp_bucket_cap_mb, "data parallelism: gradient bucket size (default 25)");
  app.add_flag("--gradient-checkpointing", a.gradient_checkpointing,
               "recompute each decoder layer's forward in the backward instead of keeping its activations");
  app.add_option("--gradient-checkpointing-kwargs", f->gradient_checkpointing_kwargs,
                 "JSON: {\"policy\": \"full\" | \"selective\", \"every_n_layers\": N}");
  app.add_flag("--estimate-memory", f->estimate_memory,
               "print the predicted peak memory per rank (weights, gradients, optimizer, activations, loss) and exit");
  app.add_flag("--disable-tqdm", a.disable_tqdm, "no progress bar: one line per log");
  app.add_option("--lora-r", f->lora_r, "train a LoRA adapter of this rank instead of the model (PEFT default 8)");
  app.add_option("--lora-alpha", f->lora_alpha, "LoRA alpha: the update is scaled by alpha / r (default 8)");
  app.add_option("--lora-dropout", f->lora_dropout, "dropout on the adapter's input in training (default 0)");
  app.add_option("--lora-target", f->lora_target, "modules to adapt, e.g. q_proj,k_proj,v_proj,o_proj "
                 "(default: PEFT's for the architecture, q_proj,v_proj)")->delimiter(',');
  app.add_flag("--use-rslora", f->use_rslora, "rank-stabilized LoRA: scale by alpha / sqrt(r)");
  return [f] { return run_train(*f); };
});

}  // namespace
}  // namespace tp::cli
