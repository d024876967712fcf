// ParallelismConfig: how sizes resolve against the number of ranks, what a
// mismatch says, and the mesh it builds (tp innermost, the flattened "dp").
#include <gtest/gtest.h>

#include "tp/distributed/parallelism_config.h"

namespace tp::dist {
namespace {

std::string error_of(const ParallelismConfig& c, int64_t world) {
  try {
    c.resolved(world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ParallelismConfig, UnsetSizesTakeWhatTheOthersLeave) {
  auto sizes = [](const ParallelismConfig& c, int64_t world) {
    const ParallelismConfig r = c.resolved(world);
    return std::vector<int64_t>{*r.dp_replicate_size, *r.dp_shard_size, *r.tp_size};
  };
  EXPECT_EQ(sizes({}, 4), (std::vector<int64_t>{1, 1, 4})) << "nothing given: every rank tensor-parallel";
  EXPECT_EQ(sizes({std::nullopt, std::nullopt, 2}, 8), (std::vector<int64_t>{4, 1, 2}));
  EXPECT_EQ(sizes({std::nullopt, 2, 2}, 8), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes({2, std::nullopt, std::nullopt}, 8), (std::vector<int64_t>{2, 1, 4}));
  EXPECT_EQ(sizes({std::nullopt, 4, std::nullopt}, 4), (std::vector<int64_t>{1, 4, 1}));
  EXPECT_EQ(sizes({2, 2, 1}, 4), (std::vector<int64_t>{2, 2, 1}));
}

TEST(ParallelismConfig, MismatchesNameEverySizeAndTheRanks) {
  const std::string total = error_of({2, 2, 2}, 4);
  EXPECT_NE(total.find("dp_replicate_size 2 x dp_shard_size 2 x tp_size 2 = 8"), std::string::npos) << total;
  EXPECT_NE(total.find("num_processes (4)"), std::string::npos) << total;
  const std::string divide = error_of({std::nullopt, std::nullopt, 3}, 4);
  EXPECT_NE(divide.find("tp_size=3"), std::string::npos) << divide;
  EXPECT_NE(divide.find("does not divide the 4 processes"), std::string::npos) << divide;
  EXPECT_NE(divide.find("dp_replicate_size cannot be derived"), std::string::npos) << divide;
  const std::string zero = error_of({0, std::nullopt, std::nullopt}, 4);
  EXPECT_NE(zero.find("dp_replicate_size is 0; parallelism sizes must be >= 1"), std::string::npos) << zero;
}

TEST(ParallelismConfig, MeshPutsTpInnermostAndFlattensDp) {
  const int w = world_size(), r = world_rank();
  const int64_t tp = w % 2 == 0 ? 2 : 1, rest = w / tp;
  const int64_t shard = rest % 2 == 0 ? 2 : 1, replicate = rest / shard;
  auto mesh = ParallelismConfig{std::nullopt, shard, tp}.build_device_mesh();
  EXPECT_EQ(mesh->sizes(), (std::vector<int64_t>{replicate, shard, tp}));
  EXPECT_EQ(mesh->coordinate("tp"), r % tp) << "a tp group is consecutive ranks";
  EXPECT_EQ(mesh->coordinate("dp_shard"), (r / tp) % shard);
  EXPECT_EQ(mesh->coordinate("dp_replicate"), r / (tp * shard));
  EXPECT_EQ(mesh->size("dp"), replicate * shard);
  EXPECT_EQ(mesh->coordinate("dp"), r / tp);
  EXPECT_TRUE(mesh->has_dim("dp"));
  EXPECT_EQ((*mesh)["dp"].group().rank(), r / tp);
  // The dp group: the ranks with this rank's tp coordinate (their sum in closed form).
  Tensor t = Tensor::from_ints({r}, {1}, DType::I64);
  mesh->group("dp").all_reduce(t);
  int64_t want = 0;
  for (int64_t d = 0; d < replicate * shard; ++d) want += d * tp + r % tp;
  EXPECT_EQ(static_cast<int64_t>(t.item()), want);
  EXPECT_EQ(mesh->root_group().size(), w);
  EXPECT_THROW((*mesh)["tp"].root_group(), Error) << "a sub-mesh has no root";
  try {
    (void)mesh->group("pp");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid names: [dp_replicate, dp_shard, tp, dp]"), std::string::npos)
        << e.what();
  }
}

}  // namespace tp::dist
