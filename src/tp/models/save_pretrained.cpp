#include "tp/models/save_pretrained.h"

#include <map>

#include "tp/models/checkpoint.h"
#include "tp/parallel/shards.h"
#include "tp/tensor/convert.h"

namespace tp {

namespace fs = std::filesystem;

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json",          "tokenizer_config.json",
                                                 "special_tokens_map.json", "tokenizer.model",
                                                 "generation_config.json",  "chat_template.jinja"};
  return names;
}

namespace {

void copy_side_files(const fs::path& from, const fs::path& to, const ModelConfig& config) {
  std::error_code ec;
  if (fs::equivalent(from, to, ec)) return;
  for (const std::string& name : tokenizer_file_names()) {
    if (!fs::exists(from / name)) continue;
    fs::path tmp = to / (name + ".tmp");
    fs::copy_file(from / name, tmp, fs::copy_options::overwrite_existing, ec);
    TP_CHECK(!ec, "cannot copy {} to {}: {}", (from / name).string(), tmp.string(), ec.message());
    fs::rename(tmp, to / name, ec);
    TP_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), (to / name).string(), ec.message());
  }
  if (!fs::exists(from / "generation_config.json")) save_generation_config(to, config);
}

}  // namespace

void prepare_output_directory(const fs::path& dir, dist::ProcessGroup& group) {
  dist::on_rank0(group, "saving", [&] {
    std::error_code ec;
    fs::create_directories(dir, ec);
    TP_CHECK(!ec, "cannot create directory {}: {}", dir.string(), ec.message());
    TP_CHECK(fs::is_directory(dir), "{} exists and is not a directory", dir.string());
  });
}

void save_pretrained(PretrainedModel& model, const fs::path& dir, const SaveOptions& options) {
  dist::ProcessGroup& group = model.mesh().group("tp");
  std::map<std::string, nn::Parameter*> by_name;
  for (nn::Parameter* p : model.lm().parameters()) by_name[p->name] = p;

  struct Item {
    const SourceTensor* source;
    nn::Parameter* param;
    std::vector<parallel::ParamShard> shards;
  };
  std::vector<Item> items;
  for (const SourceTensor& t : model.source_tensors()) {
    auto it = by_name.find(t.name);
    TP_CHECK(it != by_name.end(), "save_pretrained: the model has no parameter '{}' of the checkpoint it was loaded "
             "from ({})", t.name, model.source_dir().string());
    TP_CHECK(it->second->global_shape == t.shape, "save_pretrained: parameter '{}' has shape {}, the checkpoint's {}",
             t.name, shape_str(it->second->global_shape), shape_str(t.shape));
    items.push_back({&t, it->second, parallel::all_shards(it->second->shard, group)});
  }
  auto full_tensor = [&](const Item& item) {
    Tensor local = options.values ? options.values(*item.param) : item.param->data;
    TP_CHECK(local.defined(), "save_pretrained: parameter '{}' has no data (released after packing for inference?)",
             item.param->name);
    return parallel::gather_full(local, item.param->global_shape, item.shards, group);
  };

  prepare_output_directory(dir, group);
  if (group.rank() != 0) {
    // The same gathers, in the order rank 0's writer asks for them.
    for (const Item& item : items) full_tensor(item);
  } else {
    std::vector<io::TensorSource> sources;
    for (const Item& item : items) {
      const SourceTensor& t = *item.source;
      sources.push_back({t.name, t.dtype, t.shape, {}, [&, item](void* dst) {
                           Tensor full = full_tensor(item);
                           convert(full.raw_data(), full.dtype(), dst, item.source->dtype,
                                   static_cast<size_t>(full.numel()));
                         }});
    }
    save_checkpoint(dir, model.config(), sources, options.max_shard_bytes);
    copy_side_files(model.source_dir(), dir, model.config());
  }
  group.barrier();
}

}  // namespace tp
