#pragma once
// Helpers of the suites that load the tiny checkpoints of CTest's make_test_models fixture.
#include <cstdlib>
#include <memory>
#include <string>

#include "tp/distributed/device_mesh.h"
#include "tp/distributed/process_group.h"
#include "tp/core/error.h"

namespace tp::testing {

inline std::string model_dir(const std::string& name) {
  const char* root = std::getenv("TP_TEST_MODELS");
  if (root == nullptr) throw Error("TP_TEST_MODELS is not set (CTest's make_test_models fixture writes the models)");
  return std::string(root) + "/" + name;
}

// A mesh holding only this rank: the tp = 1 reference, computed on every rank.
inline std::shared_ptr<const dist::DeviceMesh> solo_mesh() {
  static std::shared_ptr<dist::ProcessGroup> group = dist::world().split(dist::world_rank(), 0);
  static auto mesh = std::make_shared<const dist::DeviceMesh>(*group, std::vector<int64_t>{1},
                                                              std::vector<std::string>{"tp"});
  return mesh;
}

}  // namespace tp::testing
