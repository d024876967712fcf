#pragma once
// Training checkpoints, output_dir/checkpoint-<step>/, written by every rank:
//   model_rank<r>.safetensors       this rank's f32 master weights (its shards)
//   optimizer_rank<r>.safetensors   this rank's optimizer state (metadata: optimizer, steps)
//   trainer_state.json              Transformers' TrainerState, log history included
//   training_state.json             what a resume must match (tp size, plan, model,
//                                   data, precision, optimizer) and the loop's counters
//   config.json                     the model's, for reference
// A checkpoint is complete or absent: everything is written into a hidden
// .tmp-checkpoint-<step>/ and renamed once every rank has finished, so a job
// killed (Ctrl-C, a dead rank) while saving leaves no checkpoint-<step>; the
// leftovers are removed when the next run starts.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>

#include "tp/distributed/process_group.h"

namespace tp::training {

// Writes checkpoint-<step> under output_dir: `write_files(dir)` runs on every rank
// (its own files), then rank 0 renames the directory into place. Collective.
std::filesystem::path write_checkpoint_dir(const std::filesystem::path& output_dir, int64_t step,
                                           dist::ProcessGroup& group,
                                           const std::function<void(const std::filesystem::path&)>& write_files);

// The complete checkpoint with the highest step in output_dir, if any.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& output_dir);
// Keeps the newest `limit` checkpoints (rank 0 only).
void rotate_checkpoints(const std::filesystem::path& output_dir, int64_t limit);
// Removes .tmp-checkpoint-* left by a job that died while saving (rank 0 only).
void remove_partial_checkpoints(const std::filesystem::path& output_dir);

std::string rank_file(const std::string& stem, int rank);  // "model_rank3.safetensors"

}  // namespace tp::training
