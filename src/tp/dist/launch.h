#pragma once
// tprun's logic (the executable in tp/cli/tprun only execs what this builds):
// torchrun-like flags turned into an `mpirun` command line, and the per-rank
// trampoline that exports torchrun's variables before exec'ing the program.
#include <map>
#include <string>
#include <vector>

namespace tp::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  std::string hostfile;
  std::vector<std::string> command;  // PROGRAM ARGS...
};

// Parses tprun's argv (without argv[0]); flags stop at the first non-flag
// (PROGRAM). Throws UsageError naming the bad flag or value.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);
std::string launch_usage();

struct LaunchPlan {
  std::vector<std::string> argv;              // mpirun ... <tprun> --exec-rank PROGRAM ARGS...
  std::map<std::string, std::string> env;     // set in tprun's environment and forwarded with -x
  std::string note;                           // when non-empty: print it and exit 0 instead (other nodes)
};

// `self` is tprun's own path (the trampoline), `cores` this node's CPUs, `root`
// whether we run as root, `omp_threads_env` the caller's OMP_NUM_THREADS (or empty).
LaunchPlan plan_launch(const LaunchOptions& options, const std::string& mpirun, const std::string& self, int cores,
                       bool root, const std::string& omp_threads_env);

// The trampoline's environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE
// from the launcher's variables (OpenMPI's OMPI_COMM_WORLD_*; PMI_* fallbacks).
std::map<std::string, std::string> rank_environment(const std::map<std::string, std::string>& launcher_env);

}  // namespace tp::dist
