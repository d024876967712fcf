#pragma once
// The loss curve as a PNG (train loss, and eval loss when there is one, against
// the step), drawn by gnuplot (Debian's gnuplot-nox) from a run's log history.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tp::training {

// Writes `png`; returns false with the reason in `why_not` when it cannot
// (no gnuplot installed, nothing logged yet, gnuplot failed).
bool plot_loss_curve(const std::vector<nlohmann::json>& log_history, const std::filesystem::path& png,
                     const std::string& title, std::string* why_not);

}  // namespace tp::training
