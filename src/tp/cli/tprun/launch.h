#pragma once
// tprun's logic (the executable in tp/cli/tprun only runs what this builds):
// torchrun-like flags turned into an `mpirun` command line, and the per-rank
// trampoline that exports torchrun's variables before exec'ing the program.
//
// Several nodes (`--nnodes M --node-rank R --master-addr A`, no --hostfile):
// every node runs its own tprun and together they form ONE mpirun job, so that
// MPI_COMM_WORLD (and dist::world()) spans every node. Node 0's tprun listens
// at A:port, waits for the other M-1 tprun to join (tp/cli/tprun/rendezvous.h),
// then runs mpirun over M hosts whose remote shell (plm_rsh_agent) is
// `tprun --rsh-agent`: instead of ssh, it hands OpenMPI's daemon command to
// node R's waiting tprun, which runs it (tp/cli/tprun/multinode.h). Ranks are laid
// out node-major: global rank = node_rank * N + local_rank.
#include <map>
#include <string>
#include <vector>

namespace tp::launcher {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 29500;        // torchrun's default
  double join_timeout_s = 600;    // how long node 0 waits for the others (and they for node 0)
  std::string hostfile;
  std::vector<std::string> command;  // PROGRAM ARGS...

  // Several nodes, each with its own tprun (rather than node 0 alone with --hostfile).
  bool rendezvous() const { return nnodes > 1 && hostfile.empty(); }
};

// Parses tprun's argv (without argv[0]); flags stop at the first non-flag
// (PROGRAM). Throws UsageError naming the bad flag or value.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);
std::string launch_usage();

// What tprun knows about the node it runs on.
struct LaunchHost {
  std::string mpirun = "mpirun";
  std::string self;             // tprun's own path (trampoline and remote-shell agent)
  int cores = 1;
  // Cores other processes kept busy when tprun started (from /proc/stat); the
  // ranks' default threads fill only the cores left, and a job that cannot get a
  // core per rank is told so.
  int busy_cores = 0;
  bool root = false;
  std::string omp_threads_env;  // the caller's OMP_NUM_THREADS, or empty
  std::string eager_limit_env;  // the caller's OMPI_MCA_btl_vader_eager_limit, or empty
  std::string rundir;           // the job's private directory on this node: MPI's session files (and, in a
                                // rendezvous, the hostfile and sockets); removed when the job ends
};

struct LaunchPlan {
  std::vector<std::string> argv;           // mpirun ... <tprun> --exec-rank PROGRAM ARGS... (empty on node ranks > 0
                                           // of a rendezvous: they run the daemon node 0's mpirun sends them)
  std::map<std::string, std::string> env;  // set in tprun's environment; forwarded with -x on one node (with
                                           // several, each node's ranks inherit their own node's values)
  std::string hostfile_path, hostfile;     // rendezvous node 0: the hostfile argv names, and its text
  std::string note;                        // when non-empty: print it and exit 0 instead (--hostfile, other nodes)
  std::string warning;                     // when non-empty: print it to stderr and go on (a loaded machine)
};

LaunchPlan plan_launch(const LaunchOptions& options, const LaunchHost& host);

// The hosts node 0's mpirun is given for a rendezvous: "localhost" for node 0
// (its own daemon), "tprun-node-R" for the others, which only the agent reads.
std::string node_host_name(int node_rank);
// The node rank in such a name; throws Error for any other name.
int node_of_host(const std::string& host);
// The variable through which the agent finds node 0's tprun (a Unix socket path).
inline constexpr const char* kAgentSocketEnv = "TPRUN_AGENT_SOCKET";

// The trampoline's environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE
// from the launcher's variables (OpenMPI's OMPI_COMM_WORLD_*; PMI_* fallbacks).
std::map<std::string, std::string> rank_environment(const std::map<std::string, std::string>& launcher_env);

}  // namespace tp::launcher
