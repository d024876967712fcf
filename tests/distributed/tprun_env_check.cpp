// Run by CTest through tprun: checks what tprun promises each rank (torchrun's
// variables, threads per rank, huge-page malloc), then an all-reduce over the
// world and one over a group split along nodes (NODE_RANK: a multi-node job).
//   tprun_env_check [--exit CODE]   (the last rank exits with CODE: exit-code forwarding)
//   tprun_env_check --fail          (the last rank throws while the others wait in an all-reduce)
#include <algorithm>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "tp/distributed/process_group.h"

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
    // The cores other processes left free when tprun started (it says how many it found busy).
    const int free_cores = std::max(1, CPU_COUNT(&set) - std::atoi(env("TPRUN_BUSY_CORES").c_str()));
    int per_rank = free_cores / std::atoi(env("LOCAL_WORLD_SIZE").c_str());
    expect_env("OMP_NUM_THREADS", std::to_string(per_rank < 1 ? 1 : per_rank));
  }
  // The job's own MPI session directory, which tprun removes when the job ends.
  const std::string session = env("OMPI_MCA_orte_tmpdir_base");
  if (session.find("/tprun-") == std::string::npos || !std::filesystem::is_directory(session)) {
    std::fprintf(stderr, "[%s] OMPI_MCA_orte_tmpdir_base is '%s', not an existing tprun directory\n",
                 env("RANK").c_str(), session.c_str());
    ++failures;
  }
  if (const char* master = std::getenv("TP_EXPECT_MASTER")) {  // "ADDR:PORT"
    std::string m = master;
    expect_env("MASTER_ADDR", m.substr(0, m.rfind(':')));
    expect_env("MASTER_PORT", m.substr(m.rfind(':') + 1));
  }
  tp::dist::init(&argc, &argv);
  tp::dist::ProcessGroup& g = tp::dist::world();
  if (std::to_string(g.size()) != env("WORLD_SIZE") || std::to_string(g.rank()) != env("RANK")) ++failures;
  tp::Tensor t = tp::Tensor::from_ints({g.rank()}, {1}, tp::DType::I64);
  g.all_reduce(t);
  if (static_cast<int64_t>(t.item()) != int64_t{g.size()} * (g.size() - 1) / 2) ++failures;
  // Ranks are laid out node-major: this node holds ranks node*N .. node*N + N-1.
  int local_size = std::atoi(env("LOCAL_WORLD_SIZE").c_str());
  int node = g.rank() / local_size;
  expect_env("NODE_RANK", std::to_string(node));
  expect_env("LOCAL_RANK", std::to_string(g.rank() % local_size));
  std::shared_ptr<tp::dist::ProcessGroup> on_node = g.split(node, g.rank());
  tp::Tensor n = tp::Tensor::from_ints({g.rank()}, {1}, tp::DType::I64);
  on_node->all_reduce(n);
  int64_t first = int64_t{node} * local_size;
  if (on_node->size() != local_size || on_node->rank() != g.rank() % local_size ||
      static_cast<int64_t>(n.item()) != local_size * first + int64_t{local_size} * (local_size - 1) / 2) {
    std::fprintf(stderr, "[%d] the group of node %d: rank %d of %d, sum %lld\n", g.rank(), node, on_node->rank(),
                 on_node->size(), static_cast<long long>(n.item()));
    ++failures;
  }
  bool last = g.rank() == g.size() - 1;
  if (argc > 2 && std::strcmp(argv[1], "--exit") == 0 && last) return std::atoi(argv[2]);
  if (argc > 1 && std::strcmp(argv[1], "--fail") == 0) {
    if (last) throw tp::Error("deliberate failure on the last rank");
    g.all_reduce(t);  // waits for the last rank forever unless its failure ends the job
  }
  if (g.rank() == 0 && failures == 0)
    std::printf("tprun_env_check: %d ranks ok (world sum %lld, %d per node, session directory %s)\n", g.size(),
                static_cast<long long>(t.item()), local_size, session.c_str());
  return failures == 0 ? 0 : 1;
}
