#include "tp/training/progress.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace tp::training {

namespace {

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{:02d}:{:02d}", s / 60, s % 60);
}

std::string rate_text(double per_second) {
  if (per_second >= 1e4) return fmt::format("{:.1f}k", per_second / 1e3);
  return fmt::format("{:.0f}", per_second);
}

}  // namespace

bool stderr_is_terminal() {
  const char* tty = std::getenv("TP_STDERR_IS_TTY");
  return isatty(STDERR_FILENO) || (tty != nullptr && std::string(tty) == "1");
}

ProgressCallback::ProgressCallback(bool rank0, int64_t tokens_per_step, bool terminal, FILE* out)
    : rank0_(rank0), terminal_(terminal), tokens_per_step_(tokens_per_step), out_(out) {}

void ProgressCallback::on_train_begin(const TrainingArguments& args, const TrainerState& state) {
  start_ = std::chrono::steady_clock::now();
  first_step_ = state.global_step;
  if (rank0_ && terminal_ && !args.disable_tqdm) draw(state);
}

void ProgressCallback::draw(const TrainerState& state) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = state.global_step - first_step_, total = std::max<int64_t>(state.max_steps, 1);
  const double per_step = done > 0 ? elapsed / static_cast<double>(done) : NAN;
  const double eta = per_step * static_cast<double>(state.max_steps - state.global_step);
  constexpr int kWidth = 24;
  const double fraction = std::min(1.0, static_cast<double>(state.global_step) / static_cast<double>(total));
  const int eighths = static_cast<int>(fraction * kWidth * 8);
  static const char* kParts[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  std::string bar;
  for (int i = 0; i < eighths / 8; ++i) bar += "█";
  if (eighths / 8 < kWidth) {
    bar += kParts[eighths % 8];
    bar.append(static_cast<size_t>(kWidth - eighths / 8 - (eighths % 8 ? 1 : 0)), ' ');
  }
  std::string stats;
  if (std::isfinite(loss_)) stats += fmt::format(", loss {:.4f}", loss_);
  if (std::isfinite(lr_)) stats += fmt::format(", lr {:.3g}", lr_);
  if (std::isfinite(grad_norm_)) stats += fmt::format(", grad_norm {:.3g}", grad_norm_);
  if (done > 0) stats += fmt::format(", {} tok/s", rate_text(tokens_per_step_ / per_step));
  std::fprintf(out_, "\r\033[K%3d%%|%s| %lld/%lld [%s<%s%s]", static_cast<int>(fraction * 100), bar.c_str(),
               static_cast<long long>(state.global_step), static_cast<long long>(state.max_steps),
               clock_text(elapsed).c_str(), clock_text(eta).c_str(), stats.c_str());
  std::fflush(out_);
  bar_drawn_ = true;
}

void ProgressCallback::on_step_end(const TrainingArguments& args, const TrainerState& state) {
  if (rank0_ && terminal_ && !args.disable_tqdm) draw(state);
}

void ProgressCallback::on_log(const TrainingArguments& args, const TrainerState& state, const nlohmann::json& logs) {
  if (!rank0_) return;
  if (logs.contains("loss")) {
    loss_ = logs["loss"].get<double>();
    lr_ = logs["learning_rate"].get<double>();
    grad_norm_ = logs["grad_norm"].get<double>();
  }
  const bool train_line = logs.contains("loss");
  // A line of its own, above the bar on a terminal (as Transformers' bar writes the logs).
  std::string line = fmt::format("step {}/{}", state.global_step, state.max_steps);
  for (const auto& [key, value] : logs.items()) {
    if (key == "step" || key == "epoch") continue;
    if (value.is_number_float()) line += fmt::format(" | {} {:.6g}", key, value.get<double>());
    else line += fmt::format(" | {} {}", key, value.dump());
  }
  if (train_line) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int64_t done = state.global_step - first_step_;
    if (done > 0 && elapsed > 0) {
      const double per_step = elapsed / static_cast<double>(done);
      line += fmt::format(" | {} tok/s | elapsed {} | ETA {}", rate_text(tokens_per_step_ / per_step),
                          clock_text(elapsed), clock_text(per_step * (state.max_steps - state.global_step)));
    }
  }
  std::fprintf(out_, "%s%s\n", bar_drawn_ ? "\r\033[K" : "", line.c_str());
  if (bar_drawn_ && state.global_step < state.max_steps) draw(state);
  std::fflush(out_);
}

void ProgressCallback::on_save(const TrainingArguments& args, const TrainerState& state,
                               const std::filesystem::path& dir) {
  if (!rank0_) return;
  std::fprintf(out_, "%ssaved %s\n", bar_drawn_ ? "\r\033[K" : "", dir.string().c_str());
  if (bar_drawn_) draw(state);
  std::fflush(out_);
}

void ProgressCallback::on_train_end(const TrainingArguments& args, const TrainerState& state) {
  if (rank0_ && bar_drawn_) {
    std::fputs("\n", out_);
    bar_drawn_ = false;
  }
}

JsonLinesLogger::JsonLinesLogger(bool rank0, std::filesystem::path file) : rank0_(rank0), file_(std::move(file)) {}

void JsonLinesLogger::on_train_begin(const TrainingArguments& args, const TrainerState& state) {
  if (!rank0_) return;
  out_.open(file_, std::ios::trunc);
  TP_CHECK(out_, "cannot write {}", file_.string());
  for (const nlohmann::json& entry : state.log_history) out_ << entry.dump() << "\n";
  out_.flush();
}

void JsonLinesLogger::on_log(const TrainingArguments& args, const TrainerState& state, const nlohmann::json& logs) {
  if (!rank0_ || !out_.is_open()) return;
  out_ << logs.dump() << "\n";
  out_.flush();
}

}  // namespace tp::training
