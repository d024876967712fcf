#pragma once
// What a training run is asked to do (Transformers' TrainingArguments: the same
// names and defaults) and where it stands (Transformers' TrainerState, written as
// trainer_state.json in every checkpoint).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tp/models/gradient_checkpointing.h"

namespace tp::training {

struct TrainingArguments {
  std::string output_dir = "trainer_output";
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;  // > 0 overrides num_train_epochs
  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;  // 0 disables clipping
  std::string lr_scheduler_type = "linear";
  double warmup_steps = 0;     // >= 1: steps; in (0, 1): a fraction of the total steps
  std::string optim = "adamw_torch";  // or "sgd"
  std::string optim_args;             // "momentum=0.9" for sgd
  int64_t logging_steps = 500;
  bool logging_first_step = false;
  std::string eval_strategy = "no";   // "steps": evaluate every eval_steps
  std::optional<int64_t> eval_steps;  // default: logging_steps
  std::string save_strategy = "steps";  // or "no"
  int64_t save_steps = 500;
  std::optional<int64_t> save_total_limit;
  int64_t seed = 42;
  std::optional<int64_t> data_seed;   // default: seed
  bool bf16 = false;                  // bf16 compute, f32 master weights, gradients and optimizer state
  bool loss_parallel = true;          // vocab-parallel cross-entropy when lm_head is column-parallel
  bool disable_tqdm = false;
  // Data parallelism: gradients are reduced in buckets of about this many MiB
  // (DDP's bucket_cap_mb; unset: 25).
  std::optional<double> ddp_bucket_cap_mb;
  // Activation checkpointing of the decoder layers: fewer activations kept, the
  // layers' forward run again in the backward. gradient_checkpointing_kwargs:
  // {"policy": "full" (a layer keeps only its input) or "selective" (also its
  // GEMMs', attention's and collectives' outputs), "every_n_layers": n (layer i
  // when i + 1 is a multiple of n), "use_reentrant": accepted, either value (the
  // recompute is always the non-reentrant kind)}.
  bool gradient_checkpointing = false;
  nlohmann::json gradient_checkpointing_kwargs = nlohmann::json::object();

  // FSDP over the dp_shard dim (Transformers' fsdp, space-separated options):
  // "full_shard" (parameters, gradients and optimizer state sharded; a layer's
  // weights are freed after its forward and gathered again for its backward),
  // "shard_grad_op" (the same, but kept from the forward to the backward),
  // "hybrid_shard" / "hybrid_shard_zero2" (the same two; replicas over
  // dp_replicate), "auto_wrap" (accepted: a unit is always one decoder layer).
  // fsdp_config: {"reshard_after_forward": bool (FSDP2's name; overrides the
  // choice above), "fsdp_version": 2}; keys may carry Transformers' "fsdp_" prefix.
  std::string fsdp;
  nlohmann::json fsdp_config = nlohmann::json::object();

  // The parsed checkpointing (disabled unless gradient_checkpointing); errors name the key.
  GradientCheckpointing checkpointing() const;
  // Whether fsdp is on, and its reshard_after_forward; errors name the option or key.
  struct Fsdp {
    bool enabled = false;
    bool reshard_after_forward = true;
  };
  Fsdp fsdp_options() const;

  // Checks every value; errors name the argument and the value.
  void validate() const;
  nlohmann::json to_json() const;
};

// trainer_state.json's fields (Transformers' TrainerState).
struct TrainerState {
  int64_t global_step = 0;
  double epoch = 0;
  int64_t max_steps = 0;
  double num_train_epochs = 0;
  int64_t logging_steps = 0, eval_steps = 0, save_steps = 0;
  int64_t train_batch_size = 0;
  int64_t num_input_tokens_seen = 0;
  double total_flos = 0;  // Transformers' estimate: 6 x tokens x parameters other than embeddings
  std::vector<nlohmann::json> log_history;
  nlohmann::json to_json() const;
  static TrainerState from_json(const nlohmann::json& j);
};

}  // namespace tp::training
