#include "tp/training/loss_plot.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace tp::training {

namespace fs = std::filesystem;

namespace {

// gnuplot's inline data: "step value" lines ended by "e".
std::string series(const std::vector<nlohmann::json>& history, const char* key) {
  std::string out;
  for (const nlohmann::json& e : history)
    if (e.contains(key) && e.contains("step") && e[key].is_number())
      out += fmt::format("{} {:.9g}\n", e["step"].get<int64_t>(), e[key].get<double>());
  return out;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

bool plot_loss_curve(const std::vector<nlohmann::json>& history, const fs::path& png, const std::string& title,
                     std::string* why_not) {
  const std::string train = series(history, "loss"), eval = series(history, "eval_loss");
  if (train.empty() && eval.empty()) {
    *why_not = "no loss was logged (raise --max-steps or lower --logging-steps)";
    return false;
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    *why_not = "gnuplot is not installed (Debian: apt-get install gnuplot-nox)";
    return false;
  }
  const fs::path tmp = png.string() + ".tmp";
  std::string script = fmt::format(
      "set terminal pngcairo size 900,540 enhanced font 'DejaVu Sans,11'\n"
      "set output {}\nset title {} noenhanced\nset xlabel 'step'\nset ylabel 'loss (nats per token)'\n"
      "set grid\nset key top right\n",
      quoted(tmp.string()), quoted(title));
  std::string plots, data;
  if (!train.empty()) {
    plots += "'-' using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'train loss'";
    data += train + "e\n";
  }
  if (!eval.empty()) {
    plots += std::string(plots.empty() ? "" : ", ") +
             "'-' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'eval loss'";
    data += eval + "e\n";
  }
  script += "plot " + plots + "\n" + data;
  FILE* gp = popen("gnuplot 2>&1", "w");
  if (gp == nullptr) {
    *why_not = "cannot start gnuplot";
    return false;
  }
  std::fwrite(script.data(), 1, script.size(), gp);
  const int status = pclose(gp);
  std::error_code ec;
  if (status != 0 || !fs::exists(tmp)) {
    fs::remove(tmp, ec);
    *why_not = fmt::format("gnuplot failed (exit status {})", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return false;
  }
  fs::rename(tmp, png, ec);
  if (ec) {
    *why_not = "cannot rename " + tmp.string() + ": " + ec.message();
    return false;
  }
  return true;
}

}  // namespace tp::training
