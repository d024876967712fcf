#pragma once
// save_pretrained: a Hugging Face model directory from a tensor-parallel model.
// Every rank calls it (each parameter is gathered from its shards, one at a
// time, so no rank ever holds more than one full tensor); rank 0 writes
// config.json, the weights with the names, dtypes and order of the checkpoint the
// model was loaded from (single file or shards plus the index, Transformers'
// 5GB rule), and copies the tokenizer and generation files next to them. Each
// file is written whole or not at all.
#include <cstddef>
#include <filesystem>
#include <functional>

#include "tp/models/auto.h"

namespace tp {

struct SaveOptions {
  size_t max_shard_bytes = 5ull << 30;
  // The local values to save for a parameter (default: the model's own), e.g. a
  // trainer's f32 master weights under mixed precision.
  std::function<Tensor(const nn::Parameter&)> values;
};

void save_pretrained(PretrainedModel& model, const std::filesystem::path& dir, const SaveOptions& options = {});

// Rank 0 creates `dir`; every rank learns whether that worked, so an error there
// ends all ranks the same way instead of leaving them in a gather. Collective.
void prepare_output_directory(const std::filesystem::path& dir, dist::ProcessGroup& group);

// The files of a model directory that are not weights and that a saved copy keeps.
const std::vector<std::string>& tokenizer_file_names();

}  // namespace tp
