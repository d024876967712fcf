// tprun: a torchrun-like launcher on top of OpenMPI's mpirun (see tp/cli/tprun/launch.h).
//   tprun --nproc-per-node N [...] PROGRAM ARGS...   -> runs mpirun ... tprun --exec-rank PROGRAM ARGS...
//   tprun --exec-rank PROGRAM ARGS...                 -> (in each rank) export RANK etc., exec PROGRAM
// tprun waits for mpirun, exits with the job's exit code and then removes the
// job's private directory (MPI's session files). With several nodes
// (tp/cli/tprun/multinode.h) tprun supervises mpirun (node 0) or OpenMPI's daemon
// (other nodes), and `tprun --rsh-agent HOST COMMAND` is mpirun's remote shell.
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tp/cli/tprun/launch.h"
#include "tp/cli/tprun/multinode.h"
#include "tp/core/cpu_load.h"
#include "tp/core/error.h"
#include "tp/version.h"

extern char** environ;

namespace {

int cpu_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

[[noreturn]] void exec(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "tprun: error: cannot run '%s': %s\n", args[0], std::strerror(errno));
  std::exit(127);
}

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf("%s", tp::launcher::launch_usage().c_str());
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("tprun %s\n", TP_VERSION);
    return 0;
  }
  try {
    if (!args.empty() && args[0] == "--exec-rank") {
      for (const auto& [name, value] : tp::launcher::rank_environment(environment())) setenv(name.c_str(), value.c_str(), 1);
      TP_CHECK(args.size() > 1, "tprun --exec-rank: no PROGRAM given");
      exec({args.begin() + 1, args.end()});
    }
    if (args[0] == "--rsh-agent") return tp::launcher::run_rsh_agent({args.begin() + 1, args.end()});
    tp::launcher::LaunchOptions options = tp::launcher::parse_launch_args(args);
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const char* eager_limit = std::getenv("OMPI_MCA_btl_vader_eager_limit");
    const char* mpirun = std::getenv("TP_MPIRUN");
    const int cores = cpu_count();
    tp::launcher::LaunchHost host{.mpirun = mpirun ? mpirun : "mpirun",
                              .self = std::filesystem::read_symlink("/proc/self/exe").string(),
                              .cores = cores,
                              .busy_cores = tp::busy_cores(cores),
                              .root = geteuid() == 0,
                              .omp_threads_env = omp ? omp : "",
                              .eager_limit_env = eager_limit ? eager_limit : ""};
    const tp::launcher::RunDir rundir;
    host.rundir = rundir.path();
    tp::launcher::LaunchPlan plan = tp::launcher::plan_launch(options, host);
    if (!plan.note.empty()) {
      std::printf("%s\n", plan.note.c_str());
      return 0;
    }
    if (!plan.warning.empty()) std::fprintf(stderr, "%s\n", plan.warning.c_str());
    for (const auto& [name, value] : plan.env) setenv(name.c_str(), value.c_str(), 1);
    // The ranks' output reaches the terminal through mpirun's pipes, so they
    // cannot see it is one: progress bars (tp train) ask this instead.
    if (isatty(STDERR_FILENO)) setenv("TP_STDERR_IS_TTY", "1", 1);
    if (!options.rendezvous()) return tp::launcher::run_single_node(plan);
    return options.node_rank == 0 ? tp::launcher::run_node0(options, plan) : tp::launcher::run_node(options);
  } catch (const tp::UsageError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tprun: error: %s\n", e.what());
    return 1;
  }
}
