#include "tp/training/checkpoint.h"

#include <algorithm>
#include <regex>
#include <vector>

#include "tp/core/error.h"

namespace tp::training {

namespace fs = std::filesystem;

namespace {

const std::regex& checkpoint_name() {
  static const std::regex re(R"(checkpoint-(\d+))");
  return re;
}

std::vector<std::pair<int64_t, fs::path>> checkpoints(const fs::path& output_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, checkpoint_name()))
      out.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string rank_file(const std::string& stem, int rank) { return fmt::format("{}_rank{}.safetensors", stem, rank); }

fs::path write_checkpoint_dir(const fs::path& output_dir, int64_t step, dist::ProcessGroup& group,
                              const std::function<void(const fs::path&)>& write_files) {
  const fs::path final_dir = output_dir / fmt::format("checkpoint-{}", step);
  const fs::path tmp = output_dir / fmt::format(".tmp-checkpoint-{}", step);
  dist::on_rank0(group, "cannot start checkpoint " + final_dir.string(), [&] {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  });
  write_files(tmp);
  // Every rank's files are whole before the directory gets its real name; a rank
  // that dies before this point leaves only the hidden temporary behind.
  group.barrier();
  dist::on_rank0(group, "cannot finish checkpoint " + final_dir.string(), [&] {
    if (fs::exists(final_dir)) {
      // Re-saving a step (after a resume): the old copy stays until the new one is in place.
      const fs::path old = output_dir / fmt::format(".old-checkpoint-{}", step);
      fs::remove_all(old);
      fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      fs::remove_all(old);
    } else {
      fs::rename(tmp, final_dir);
    }
  });
  return final_dir;
}

std::optional<fs::path> latest_checkpoint(const fs::path& output_dir) {
  auto all = checkpoints(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

void rotate_checkpoints(const fs::path& output_dir, int64_t limit) {
  auto all = checkpoints(output_dir);
  for (size_t i = 0; i + static_cast<size_t>(limit) < all.size(); ++i) fs::remove_all(all[i].second);
}

void remove_partial_checkpoints(const fs::path& output_dir) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return;
  std::vector<fs::path> partial, old;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-checkpoint-", 0) == 0) partial.push_back(e.path());
    if (name.rfind(".old-checkpoint-", 0) == 0) old.push_back(e.path());
  }
  for (const fs::path& p : partial) fs::remove_all(p, ec);
  // A job killed between moving the old copy aside and renaming the new one in:
  // the old copy is the complete checkpoint of that step.
  for (const fs::path& p : old) {
    const fs::path real = output_dir / p.filename().string().substr(std::string(".old-").size());
    if (fs::exists(real)) fs::remove_all(p, ec);
    else fs::rename(p, real, ec);
  }
}

}  // namespace tp::training
