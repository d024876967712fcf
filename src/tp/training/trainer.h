#pragma once
// The Trainer: Hugging Face's training loop on a tensor-parallel model.
//
//   tp::PretrainedModel model = tp::AutoModelForCausalLM::from_pretrained(dir, tp::LoadOptions::for_training());
//   tp::Trainer trainer(model, tp::TrainingArguments{.output_dir = "out", .max_steps = 100}, train_blocks);
//   trainer.train();
//   trainer.save_model();
//
// Names and defaults are Transformers' TrainingArguments. One optimizer step:
// gradient_accumulation_steps micro-batches of per_device_train_batch_size
// blocks, forward and backward each (the loss normalized by the targets of the
// whole step), the replicated gradients made identical on every rank, the true
// global gradient norm and clipping, the optimizer on each rank's shards, the
// schedule. Every tp rank runs the same steps on the same batches.
//
// Data parallelism comes with the model's mesh (dist::ParallelismConfig: dims
// dp_replicate, dp_shard, tp and the flattened dp): each global micro-batch is
// per_device_train_batch_size x dp blocks, and dp rank d trains on the d-th
// slice (all tp ranks of a replica on the same one). The loss is normalized by
// the targets of the whole global step, gradients are summed over dp in buckets
// while the backward runs (GradientReducer), and the loss, the token counts and
// the gradient norm are global: a dp x tp run logs what one rank with the whole
// global batch would.
//
// Expert parallelism comes with the model's mesh too ("ep", "ep_replicas"):
// every rank trains on the same batches, the experts' parameters are updated by
// the rank that holds them, the rest identically by every ep replica
// (ModelParameters::sync_ep_replicas).
//
// MoE models whose config sets output_router_logits add Transformers' router
// load-balancing loss (the forward's aux_loss, tp/ops/router_loss.h) times router_aux_loss_coef to each
// micro-batch's loss, as MixtralForCausalLM does with its labels: the step's
// loss is the cross-entropy over the step's targets plus coef x the sum of the
// micro-batches' aux losses (Transformers' Trainer does not divide a loss that
// takes num_items_in_batch by the accumulation steps). Logged as aux_loss.
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tp/models/auto.h"
#include "tp/nn/moe.h"
#include "tp/training/arguments.h"
#include "tp/training/data.h"
#include "tp/training/loss.h"
#include "tp/training/optimizer.h"
#include "tp/training/parameters.h"
#include "tp/training/schedule.h"

namespace tp::training {

class GradientReducer;
class FullyShardedDataParallel;

// Hooks around the loop (Transformers' TrainerCallback); called on every rank.
class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  virtual void on_train_begin(const TrainingArguments&, const TrainerState&) {}
  virtual void on_step_begin(const TrainingArguments&, const TrainerState&) {}
  virtual void on_step_end(const TrainingArguments&, const TrainerState&) {}
  virtual void on_log(const TrainingArguments&, const TrainerState&, const nlohmann::json& logs) {}
  virtual void on_save(const TrainingArguments&, const TrainerState&, const std::filesystem::path& checkpoint) {}
  virtual void on_train_end(const TrainingArguments&, const TrainerState&) {}
};

// When a Trainer trains part of a model (PEFT adapters): what it trains, and how
// save_model writes what it trained.
struct TrainerOptions {
  // Parameter names to train (unset: all); the rest are frozen (no gradient, no optimizer state).
  std::function<bool(const std::string&)> trainable;
  // Replaces save_model's save_pretrained: the directory, and each parameter's
  // local f32 master values (a frozen parameter's are its own).
  std::function<void(const std::filesystem::path&, const std::function<Tensor(const nn::Parameter&)>&)> save_model;
  // Called at the start of every training_step with the step's index and where
  // this rank's token rows start in each global micro-batch (an adapter keys its
  // dropout masks by both, so a resumed run, and a data-parallel one, draws the
  // masks of the uninterrupted one-rank run).
  std::function<void(int64_t global_step, int64_t first_row)> on_step_begin;
  // Under bf16: whether the matrices compute as bf16 tensors on native bf16 GEMMs
  // (true) or as f32 tensors of bf16 values on f32 GEMMs (false), the same
  // products. Unset: whichever rank 0 measured the faster (ops::detail::bf16_gemm_native).
  std::optional<bool> bf16_native_gemm;
  // Under bf16 without FSDP: the matrices' bf16 compute weights exist a decoder
  // layer (or the root: embeddings, lm_head) at a time, rounded from the masters
  // where the layer runs, forward and backward (training/fsdp.h's units with
  // d = 1), instead of a whole bf16 copy of the model. The same values either way;
  // false keeps the whole copy (a baseline to measure it against).
  bool compute_copy_by_layer = true;
};

struct MicroBatch {
  Tensor input_ids;  // [B, T] i64
  Tensor labels;     // [B, T] i64 (ignore_index -100 where nothing is predicted)
};

struct StepResult {
  double loss = 0;          // the step's loss (mean over its targets; with the routers' aux loss, plus coef x aux per micro-batch)
  double aux_loss = 0;      // the routers' load-balancing loss, mean over the micro-batches (0 when not enabled)
  double grad_norm = 0;     // before clipping
  double learning_rate = 0; // used by this step
  int64_t targets = 0;
  // Where the step's time went (this rank's wall clock, seconds).
  double forward_backward_s = 0, grad_norm_s = 0, optimizer_s = 0;
  // Data-parallel communication this rank waited for (not hidden behind the backward).
  double data_parallel_s = 0;
};

struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;  // mean of the step losses of this run
  nlohmann::json metrics;
};

class Trainer {
 public:
  // The model must be loaded for training (LoadOptions::for_training()). `eval`
  // is optional. Errors (arguments, data too short, an unwritable output_dir)
  // come from here, before any step.
  Trainer(PretrainedModel& model, TrainingArguments args, std::shared_ptr<const TokenBlocks> train,
          std::shared_ptr<const TokenBlocks> eval = nullptr, TrainerOptions options = {});
  ~Trainer();

  // The whole run. `resume_from_checkpoint`: a checkpoint directory, "last" (the
  // newest complete one in output_dir), or empty. Bit-exact: the rest of the run
  // gives the losses and weights the uninterrupted run would have.
  TrainOutput train(const std::string& resume_from_checkpoint = "");
  // Mean loss over the eval blocks (and perplexity), logged as eval_*.
  nlohmann::json evaluate();
  // One optimizer step on the given micro-batches (what train() runs per step);
  // under data parallelism each dp rank passes its own slice of the global step
  // (every dp rank the same number of micro-batches; a slice may be empty).
  StepResult training_step(const std::vector<MicroBatch>& micro_batches);

  // save_pretrained of the f32 master weights (Hugging Face files), or the
  // options' save_model; "" = output_dir.
  void save_model(const std::filesystem::path& dir = "");
  // output_dir/checkpoint-<global_step>: complete or absent.
  std::filesystem::path save_checkpoint();
  void load_checkpoint(const std::filesystem::path& dir);

  void add_callback(std::shared_ptr<TrainerCallback> callback) { callbacks_.push_back(std::move(callback)); }
  const TrainerState& state() const { return state_; }
  const TrainingArguments& args() const { return args_; }
  ModelParameters& parameters() { return *params_; }
  Optimizer& optimizer() { return *optimizer_; }
  GradientReducer* gradient_reducer() { return reducer_.get(); }  // null without data parallelism, or under fsdp
  // null unless args.fsdp, or the compute copies are held by layer (TrainerOptions::compute_copy_by_layer)
  FullyShardedDataParallel* fsdp() { return fsdp_.get(); }
  PretrainedModel& model() { return model_; }
  // The cross-entropy runs on lm_head's vocabulary slices (args.loss_parallel and a column-parallel lm_head).
  bool loss_parallel() const { return loss_parallel_; }
  // The loss is computed from lm_head's input a chunk of tokens at a time (no
  // [tokens, vocab] logits): lm_head keeps its vocabulary slice (or tp = 1) and has no bias or adapter.
  bool fused_loss() const;
  int64_t dp_size() const { return dp_size_; }
  int dp_rank() const { return dp_rank_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t warmup() const { return warmup_; }
  double lr_at(int64_t step) const;

 private:
  std::vector<MicroBatch> micro_batches_for(int64_t step) const;
  void log(nlohmann::json logs);
  void maybe_log_save_evaluate(const StepResult& r, double step_seconds);
  // A micro-batch's loss: through the fused, chunked lm_head + cross-entropy
  // (causal_lm_loss_from_hidden) where it applies, else from the logits; and
  // the routers' aux loss (CausalLMOutput::aux_loss) when it is on.
  struct MicroBatchLoss {
    Tensor loss;
    Tensor aux_loss;
  };
  MicroBatchLoss loss_of(const Tensor& ids, const Tensor& labels, double normalizer, const VocabSlice& vocab);
  nlohmann::json checkpoint_identity() const;

  // The aux loss's coefficient (unset: no routers, or output_router_logits is off).
  std::optional<double> router_aux_loss_coef_;

  PretrainedModel& model_;
  TrainingArguments args_;
  std::shared_ptr<const TokenBlocks> train_, eval_;
  TrainerOptions options_;
  dist::ProcessGroup* job_ = nullptr;  // every rank of the model's mesh
  dist::ProcessGroup* dp_ = nullptr;   // this rank's data-parallel group (null: no data parallelism)
  int64_t dp_size_ = 1;
  bool loss_parallel_ = false;
  int dp_rank_ = 0;
  std::unique_ptr<ModelParameters> params_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<FullyShardedDataParallel> fsdp_;
  // FSDP: a micro-batch for a dp rank that has none (every rank must run every
  // unit's collectives): one block whose targets are all ignored.
  MicroBatch idle_micro_batch() const;
  std::unique_ptr<Optimizer> optimizer_;
  ScheduleType schedule_;
  int64_t steps_per_epoch_ = 1, total_steps_ = 0, warmup_ = 0;
  TrainerState state_;
  std::vector<std::shared_ptr<TrainerCallback>> callbacks_;
  // Since the last log: summed step losses and step count (part of a checkpoint,
  // so a resumed run logs the same averages).
  double window_loss_ = 0, window_aux_loss_ = 0;
  int64_t window_steps_ = 0;
  double run_loss_ = 0;
  int64_t run_steps_ = 0;
  double flos_per_token_ = 0;
};

}  // namespace tp::training

namespace tp {
using training::Trainer;
using training::TrainingArguments;
}  // namespace tp
