#include "tp/models/save_pretrained.h"

#include <map>

#include "tp/models/checkpoint.h"
#include "tp/models/moe_checkpoint.h"
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
  // With expert parallelism the experts are spread over "ep" (every rank; the tp groups inside it).
  dist::ProcessGroup& group = model.mesh().group(model.mesh().has_dim("ep") ? "ep" : "tp");
  std::map<std::string, nn::Parameter*> by_name;
  for (nn::Parameter* p : model.lm().parameters()) by_name[p->name] = p;

  struct Item {
    const SourceTensor* source;
    nn::Parameter* param;
    std::vector<nn::ParamShard> shards;
    FusedLocation at;  // where the checkpoint tensor lives in `param` (a per-expert Hub tensor), else the whole
  };
  std::vector<Item> items;
  for (const SourceTensor& t : model.source_tensors()) {
    auto it = by_name.find(t.name);
    FusedLocation at{t.name};
    if (it == by_name.end()) {  // a Hub name of a fused MoE parameter
      if (std::optional<FusedLocation> f = fused_location(t.name, 0); f && by_name.count(f->param)) {
        it = by_name.find(f->param);
        at = *fused_location(t.name, it->second->global_shape.at(1));
      }
    }
    TP_CHECK(it != by_name.end(), "save_pretrained: the model has no parameter '{}' of the checkpoint it was loaded "
             "from ({})", t.name, model.source_dir().string());
    if (at.expert < 0)
      TP_CHECK(it->second->global_shape == t.shape, "save_pretrained: parameter '{}' has shape {}, the checkpoint's {}",
               t.name, shape_str(it->second->global_shape), shape_str(t.shape));
    items.push_back({&t, it->second, parallel::all_shards(it->second->shard, group), at});
  }
  // Consecutive Hub tensors of one fused parameter share its gather (the same on every rank).
  std::string gathered_name;
  Tensor gathered;
  auto full_tensor = [&](const Item& item) {
    if (gathered_name != item.param->name) {
      Tensor local = options.values ? options.values(*item.param) : item.param->data;
      TP_CHECK(local.defined(), "save_pretrained: parameter '{}' has no data (released after packing for inference?)",
               item.param->name);
      gathered = parallel::gather_full(local, item.param->global_shape, item.shards, group);
      gathered_name = item.at.expert < 0 ? std::string() : item.param->name;
    }
    if (item.at.expert < 0) {
      Tensor whole = gathered;
      gathered = Tensor();
      return whole;
    }
    Tensor expert = gathered.select(0, item.at.expert);  // [A, B]
    Tensor rows = item.at.rows > 0 ? expert.narrow(0, item.at.row_offset, item.at.rows) : expert;
    TP_CHECK(rows.shape() == item.source->shape, "save_pretrained: '{}' would be written as {}, the checkpoint's is {}",
             item.source->name, shape_str(rows.shape()), shape_str(item.source->shape));
    return rows.clone();
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
