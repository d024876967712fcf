#pragma once
// What rank 0 shows while a Trainer runs, as Transformers' ProgressCallback and
// PrinterCallback do: a line per log (loss, learning rate, gradient norm, tokens
// per second, ETA; eval metrics), and on a terminal a progress bar under them,
// redrawn every step. Terminal: stderr is one, or tprun said so (TP_STDERR_IS_TTY; ranks
// write through mpirun's pipes).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tp/training/trainer.h"

namespace tp::training {

bool stderr_is_terminal();

class ProgressCallback : public TrainerCallback {
 public:
  // `tokens_per_step`: tokens one optimizer step trains on (for tokens/s).
  ProgressCallback(bool rank0, int64_t tokens_per_step, bool terminal = stderr_is_terminal(), FILE* out = stderr);
  void on_train_begin(const TrainingArguments& args, const TrainerState& state) override;
  void on_step_end(const TrainingArguments& args, const TrainerState& state) override;
  void on_log(const TrainingArguments& args, const TrainerState& state, const nlohmann::json& logs) override;
  void on_save(const TrainingArguments& args, const TrainerState& state, const std::filesystem::path& dir) override;
  void on_train_end(const TrainingArguments& args, const TrainerState& state) override;

 private:
  void draw(const TrainerState& state);
  bool rank0_, terminal_;
  int64_t tokens_per_step_;
  FILE* out_;
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = 0;
  double loss_ = NAN, lr_ = NAN, grad_norm_ = NAN;
  bool bar_drawn_ = false;
};

// Appends every log entry to a JSON lines file (rank 0): `log_history.jsonl` in
// output_dir. A resumed run rewrites the entries the checkpoint carried first.
class JsonLinesLogger : public TrainerCallback {
 public:
  JsonLinesLogger(bool rank0, std::filesystem::path file);
  void on_train_begin(const TrainingArguments& args, const TrainerState& state) override;
  void on_log(const TrainingArguments& args, const TrainerState& state, const nlohmann::json& logs) override;
  const std::filesystem::path& file() const { return file_; }

 private:
  bool rank0_;
  std::filesystem::path file_;
  std::ofstream out_;
};

}  // namespace tp::training
