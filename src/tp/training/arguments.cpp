#include "tp/training/arguments.h"

#include <cmath>
#include <sstream>

#include "tp/core/error.h"
#include "tp/training/schedule.h"

namespace tp::training {

using nlohmann::json;

void TrainingArguments::validate() const {
  TP_CHECK(!output_dir.empty(), "output_dir must not be empty");
  TP_CHECK(learning_rate > 0 && std::isfinite(learning_rate), "learning_rate must be > 0, got {}", learning_rate);
  TP_CHECK(max_steps > 0 || (max_steps == -1 && num_train_epochs > 0),
           "max_steps must be > 0 (or -1 to use num_train_epochs, which must then be > 0); got max_steps {} and "
           "num_train_epochs {}", max_steps, num_train_epochs);
  TP_CHECK(per_device_train_batch_size >= 1, "per_device_train_batch_size must be >= 1, got {}",
           per_device_train_batch_size);
  TP_CHECK(per_device_eval_batch_size >= 1, "per_device_eval_batch_size must be >= 1, got {}",
           per_device_eval_batch_size);
  TP_CHECK(gradient_accumulation_steps >= 1, "gradient_accumulation_steps must be >= 1, got {}",
           gradient_accumulation_steps);
  TP_CHECK(weight_decay >= 0, "weight_decay must be >= 0, got {}", weight_decay);
  TP_CHECK(adam_beta1 >= 0 && adam_beta1 < 1 && adam_beta2 >= 0 && adam_beta2 < 1,
           "adam_beta1 and adam_beta2 must be in [0, 1), got {} and {}", adam_beta1, adam_beta2);
  TP_CHECK(adam_epsilon >= 0, "adam_epsilon must be >= 0, got {}", adam_epsilon);
  TP_CHECK(!ddp_bucket_cap_mb || *ddp_bucket_cap_mb > 0, "ddp_bucket_cap_mb must be > 0, got {}",
           ddp_bucket_cap_mb.value_or(0));
  TP_CHECK(max_grad_norm >= 0, "max_grad_norm must be >= 0 (0 disables clipping), got {}", max_grad_norm);
  TP_CHECK(warmup_steps >= 0, "warmup_steps must be >= 0, got {}", warmup_steps);
  parse_schedule(lr_scheduler_type);
  TP_CHECK(optim == "adamw_torch" || optim == "adamw_torch_fused" || optim == "sgd",
           "optim '{}' is not supported; supported: adamw_torch, adamw_torch_fused (the same here), sgd", optim);
  TP_CHECK(logging_steps >= 1, "logging_steps must be >= 1, got {}", logging_steps);
  TP_CHECK(eval_strategy == "no" || eval_strategy == "steps", "eval_strategy '{}' is not supported; supported: no, steps",
           eval_strategy);
  TP_CHECK(save_strategy == "no" || save_strategy == "steps", "save_strategy '{}' is not supported; supported: no, steps",
           save_strategy);
  TP_CHECK(!eval_steps || *eval_steps >= 1, "eval_steps must be >= 1, got {}", eval_steps.value_or(0));
  TP_CHECK(save_steps >= 1, "save_steps must be >= 1, got {}", save_steps);
  TP_CHECK(!save_total_limit || *save_total_limit >= 1, "save_total_limit must be >= 1, got {}",
           save_total_limit.value_or(0));
  checkpointing();
  fsdp_options();
}

TrainingArguments::Fsdp TrainingArguments::fsdp_options() const {
  Fsdp f;
  std::istringstream words(fsdp);
  bool any = false;
  for (std::string w; words >> w; any = true) {
    if (w == "full_shard" || w == "hybrid_shard") {
      f.enabled = true;
    } else if (w == "shard_grad_op" || w == "hybrid_shard_zero2") {
      f.enabled = true;
      f.reshard_after_forward = false;
    } else if (w != "auto_wrap") {
      fail("fsdp option '{}' is not supported; supported: full_shard, shard_grad_op, hybrid_shard, "
           "hybrid_shard_zero2, auto_wrap (offload is not: the parameters live in host memory already)", w);
    }
  }
  TP_CHECK(!any || f.enabled, "fsdp '{}' names no sharding strategy; add full_shard or shard_grad_op", fsdp);
  const json& config = fsdp_config;
  TP_CHECK(config.is_object() || config.is_null(), "fsdp_config must be a JSON object, got {}", config.dump());
  if (config.is_null()) return f;
  for (const auto& [raw_key, value] : config.items()) {
    const std::string key = raw_key.rfind("fsdp_", 0) == 0 ? raw_key.substr(5) : raw_key;
    if (key == "reshard_after_forward") {
      TP_CHECK(value.is_boolean(), "fsdp_config: {} must be true or false, got {}", raw_key, value.dump());
      f.reshard_after_forward = value.get<bool>();
    } else if (key == "version") {
      TP_CHECK(value == 2, "fsdp_config: {} {} is not supported; supported: 2 (per-parameter sharding, FSDP2)",
               raw_key, value.dump());
    } else {
      fail("fsdp_config: '{}' is not supported; supported: reshard_after_forward, fsdp_version", raw_key);
    }
  }
  TP_CHECK(f.enabled || config.empty(), "fsdp_config {} was given without fsdp (set fsdp to full_shard, or drop it)",
           config.dump());
  return f;
}

GradientCheckpointing TrainingArguments::checkpointing() const {
  const json& kw = gradient_checkpointing_kwargs;
  TP_CHECK(kw.is_object() || kw.is_null(), "gradient_checkpointing_kwargs must be a JSON object, got {}", kw.dump());
  GradientCheckpointing c;
  c.enabled = gradient_checkpointing;
  if (kw.is_null()) return c;
  for (const auto& [key, value] : kw.items()) {
    if (key == "policy") {
      TP_CHECK(value == "full" || value == "selective",
               "gradient_checkpointing_kwargs: policy {} is not supported; supported: \"full\", \"selective\"",
               value.dump());
      c.policy = value == "full" ? autograd::CheckpointPolicy::Full : autograd::CheckpointPolicy::Selective;
    } else if (key == "every_n_layers") {
      TP_CHECK(value.is_number_integer() && value.get<int64_t>() >= 1,
               "gradient_checkpointing_kwargs: every_n_layers must be an integer >= 1, got {}", value.dump());
      c.every_n_layers = value.get<int64_t>();
    } else if (key == "use_reentrant") {
      TP_CHECK(value.is_boolean(), "gradient_checkpointing_kwargs: use_reentrant must be true or false, got {}",
               value.dump());
    } else {
      fail("gradient_checkpointing_kwargs: '{}' is not supported; supported: policy, every_n_layers, use_reentrant",
           key);
    }
  }
  TP_CHECK(c.enabled || kw.empty(),
           "gradient_checkpointing_kwargs {} were given without gradient_checkpointing (turn it on, or drop them)",
           kw.dump());
  return c;
}

json TrainingArguments::to_json() const {
  json j = {{"output_dir", output_dir},
            {"num_train_epochs", num_train_epochs},
            {"max_steps", max_steps},
            {"per_device_train_batch_size", per_device_train_batch_size},
            {"per_device_eval_batch_size", per_device_eval_batch_size},
            {"gradient_accumulation_steps", gradient_accumulation_steps},
            {"learning_rate", learning_rate},
            {"weight_decay", weight_decay},
            {"adam_beta1", adam_beta1},
            {"adam_beta2", adam_beta2},
            {"adam_epsilon", adam_epsilon},
            {"max_grad_norm", max_grad_norm},
            {"ddp_bucket_cap_mb", ddp_bucket_cap_mb ? nlohmann::json(*ddp_bucket_cap_mb) : nlohmann::json(nullptr)},
            {"lr_scheduler_type", lr_scheduler_type},
            {"warmup_steps", warmup_steps},
            {"optim", optim},
            {"optim_args", optim_args},
            {"logging_steps", logging_steps},
            {"logging_first_step", logging_first_step},
            {"eval_strategy", eval_strategy},
            {"save_strategy", save_strategy},
            {"save_steps", save_steps},
            {"seed", seed},
            {"bf16", bf16},
            {"loss_parallel", loss_parallel},
            {"gradient_checkpointing", gradient_checkpointing},
            {"gradient_checkpointing_kwargs", gradient_checkpointing_kwargs},
            {"fsdp", fsdp},
            {"fsdp_config", fsdp_config}};
  j["eval_steps"] = eval_steps ? json(*eval_steps) : json(nullptr);
  j["save_total_limit"] = save_total_limit ? json(*save_total_limit) : json(nullptr);
  j["data_seed"] = data_seed ? json(*data_seed) : json(nullptr);
  return j;
}

json TrainerState::to_json() const {
  return {{"best_global_step", nullptr},
          {"best_metric", nullptr},
          {"best_model_checkpoint", nullptr},
          {"epoch", epoch},
          {"eval_steps", eval_steps},
          {"global_step", global_step},
          {"is_hyper_param_search", false},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"log_history", log_history},
          {"logging_steps", logging_steps},
          {"max_steps", max_steps},
          {"num_input_tokens_seen", num_input_tokens_seen},
          {"num_train_epochs", num_train_epochs},
          {"save_steps", save_steps},
          {"stateful_callbacks", json::object()},
          {"total_flos", total_flos},
          {"train_batch_size", train_batch_size},
          {"trial_name", nullptr},
          {"trial_params", nullptr}};
}

TrainerState TrainerState::from_json(const json& j) {
  TrainerState s;
  s.global_step = j.at("global_step").get<int64_t>();
  s.epoch = j.at("epoch").get<double>();
  s.max_steps = j.at("max_steps").get<int64_t>();
  s.num_train_epochs = j.at("num_train_epochs").get<double>();
  s.logging_steps = j.at("logging_steps").get<int64_t>();
  s.eval_steps = j.at("eval_steps").get<int64_t>();
  s.save_steps = j.at("save_steps").get<int64_t>();
  s.train_batch_size = j.at("train_batch_size").get<int64_t>();
  s.num_input_tokens_seen = j.value("num_input_tokens_seen", int64_t{0});
  s.total_flos = j.value("total_flos", 0.0);
  for (const json& e : j.at("log_history")) s.log_history.push_back(e);
  return s;
}

}  // namespace tp::training
