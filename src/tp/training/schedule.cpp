#include "tp/training/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "tp/core/error.h"

namespace tp::training {

std::vector<std::string> schedule_names() { return {"linear", "cosine", "constant", "constant_with_warmup"}; }

ScheduleType parse_schedule(const std::string& name) {
  if (name == "linear") return ScheduleType::Linear;
  if (name == "cosine") return ScheduleType::Cosine;
  if (name == "constant" || name == "constant_with_warmup") return ScheduleType::Constant;
  fail("lr_scheduler_type '{}' is not supported; supported: {}", name, fmt::join(schedule_names(), ", "));
}

std::string schedule_name(ScheduleType type) {
  switch (type) {
    case ScheduleType::Linear: return "linear";
    case ScheduleType::Cosine: return "cosine";
    case ScheduleType::Constant: return "constant";
  }
  return "?";
}

double lr_factor(ScheduleType type, int64_t step, int64_t warmup_steps, int64_t total_steps) {
  const double s = static_cast<double>(step), w = static_cast<double>(warmup_steps),
               t = static_cast<double>(total_steps);
  if (step < warmup_steps) return s / std::max(1.0, w);
  switch (type) {
    case ScheduleType::Linear: return std::max(0.0, (t - s) / std::max(1.0, t - w));
    case ScheduleType::Cosine: {
      const double progress = (s - w) / std::max(1.0, t - w);
      return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 2.0 * 0.5 * progress)));
    }
    case ScheduleType::Constant: return 1.0;
  }
  return 1.0;
}

}  // namespace tp::training
