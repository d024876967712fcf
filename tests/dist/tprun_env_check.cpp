// Run by CTest through tprun: checks what tprun promises each rank (torchrun's
// variables, threads per rank, huge-page malloc), then an all-reduce.
//   tprun_env_check [--exit CODE]   (the last rank exits with CODE: exit-code forwarding)
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tp/dist/process_group.h"

namespace {

int failures = 0;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

void expect_env(const char* name, const std::string& want) {
  if (env(name) == want) return;
  std::fprintf(stderr, "[%s] %s is '%s', expected '%s'\n", env("RANK").c_str(), name, env(name).c_str(), want.c_str());
  ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  // Before init: these must come from tprun itself, not from tp::dist::init.
  expect_env("RANK", env("OMPI_COMM_WORLD_RANK"));
  expect_env("WORLD_SIZE", env("OMPI_COMM_WORLD_SIZE"));
  expect_env("LOCAL_RANK", env("OMPI_COMM_WORLD_LOCAL_RANK"));
  expect_env("LOCAL_WORLD_SIZE", env("OMPI_COMM_WORLD_LOCAL_SIZE"));
  expect_env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1");
  const char* want_threads = std::getenv("TP_EXPECT_OMP_THREADS");
  if (want_threads) {
    expect_env("OMP_NUM_THREADS", want_threads);
  } else {
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    int per_rank = CPU_COUNT(&set) / std::atoi(env("LOCAL_WORLD_SIZE").c_str());
    expect_env("OMP_NUM_THREADS", std::to_string(per_rank < 1 ? 1 : per_rank));
  }
  tp::dist::init(&argc, &argv);
  tp::dist::ProcessGroup& g = tp::dist::world();
  if (std::to_string(g.size()) != env("WORLD_SIZE") || std::to_string(g.rank()) != env("RANK")) ++failures;
  tp::Tensor t = tp::Tensor::from_ints({g.rank()}, {1}, tp::DType::I64);
  g.all_reduce(t);
  if (static_cast<int64_t>(t.item()) != int64_t{g.size()} * (g.size() - 1) / 2) ++failures;
  if (argc > 2 && std::strcmp(argv[1], "--exit") == 0 && g.rank() == g.size() - 1) return std::atoi(argv[2]);
  if (g.rank() == 0 && failures == 0) std::printf("tprun_env_check: %d ranks ok\n", g.size());
  return failures == 0 ? 0 : 1;
}
