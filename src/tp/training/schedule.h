#pragma once
// Learning-rate schedules as Transformers builds them (optimization.py): a
// factor of the base rate, as a function of the optimizer step s = 0, 1, ...
// (the number of steps taken before this one), with W warmup and T total steps:
//   warmup (s < W):  s / max(1, W)
//   linear:          max(0, (T − s) / max(1, T − W))
//   cosine:          p = (s − W) / max(1, T − W);  max(0, ½(1 + cos(2π·0.5·p)))
//   constant:        1
// Transformers' "constant" ignores warmup and "constant_with_warmup" honours it;
// here both honour it (a warmup asked for is never dropped silently).
#include <cstdint>
#include <string>
#include <vector>

namespace tp::training {

enum class ScheduleType { Linear, Cosine, Constant };

// "linear", "cosine", "constant", "constant_with_warmup"; the error lists them.
ScheduleType parse_schedule(const std::string& name);
std::string schedule_name(ScheduleType type);
std::vector<std::string> schedule_names();

double lr_factor(ScheduleType type, int64_t step, int64_t warmup_steps, int64_t total_steps);

}  // namespace tp::training
