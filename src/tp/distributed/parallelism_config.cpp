#include "tp/distributed/parallelism_config.h"

namespace tp::dist {

namespace {

std::string size_str(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "auto"; }

// `known` sizes multiply to `product`; the missing size is world / product.
int64_t derive(const char* name, int64_t product, int64_t world, const ParallelismConfig& c) {
  TP_CHECK(world % product == 0,
           "ParallelismConfig ({}): the given sizes multiply to {}, which does not divide the {} processes, so {} "
           "cannot be derived; choose sizes whose product divides {}",
           c.to_string(), product, world, name, world);
  return world / product;
}

}  // namespace

std::string ParallelismConfig::to_string() const {
  return fmt::format("dp_replicate_size={}, dp_shard_size={}, tp_size={}", size_str(dp_replicate_size),
                     size_str(dp_shard_size), size_str(tp_size));
}

ParallelismConfig ParallelismConfig::resolved(int64_t world) const {
  for (const auto& [name, v] : {std::pair{"dp_replicate_size", dp_replicate_size},
                                std::pair{"dp_shard_size", dp_shard_size}, std::pair{"tp_size", tp_size}})
    TP_CHECK(!v || *v >= 1, "ParallelismConfig: {} is {}; parallelism sizes must be >= 1", name, *v);
  ParallelismConfig r = *this;
  r.dp_shard_size = dp_shard_size.value_or(1);
  if (!tp_size && !dp_replicate_size) {
    r.dp_replicate_size = 1;
    r.tp_size = derive("tp_size", *r.dp_shard_size, world, *this);
  } else if (!dp_replicate_size) {
    r.dp_replicate_size = derive("dp_replicate_size", *tp_size * *r.dp_shard_size, world, *this);
  } else if (!tp_size) {
    r.tp_size = derive("tp_size", *dp_replicate_size * *r.dp_shard_size, world, *this);
  }
  const int64_t total = *r.dp_replicate_size * *r.dp_shard_size * *r.tp_size;
  TP_CHECK(total == world,
           "ParallelismConfig total_size (dp_replicate_size {} x dp_shard_size {} x tp_size {} = {}) does not match "
           "num_processes ({}); the sizes must multiply to the number of ranks (e.g. tprun --nproc-per-node {})",
           *r.dp_replicate_size, *r.dp_shard_size, *r.tp_size, total, world, total);
  return r;
}

std::shared_ptr<const DeviceMesh> ParallelismConfig::build_device_mesh() const {
  const ParallelismConfig r = resolved(world_size());
  DeviceMesh mesh({*r.dp_replicate_size, *r.dp_shard_size, *r.tp_size}, {"dp_replicate", "dp_shard", "tp"});
  return std::make_shared<const DeviceMesh>(mesh.with_flattened({"dp_replicate", "dp_shard"}, "dp"));
}

}  // namespace tp::dist
