#include "tp/cli/tprun/launch.h"

#include <algorithm>
#include <type_traits>

#include "tp/core/error.h"

namespace tp::launcher {
namespace {

// The whole of `value` as a T (std::stoi / std::stod), at least `min`.
template <class T>
T parse_number(const std::string& flag, const std::string& value, T min, const char* expects) {
  size_t used = 0;
  T v{};
  try {
    if constexpr (std::is_integral_v<T>)
      v = std::stoi(value, &used);
    else
      v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || !(v >= min))
    throw UsageError(fmt::format("{} expects {}, got '{}'", flag, expects, value));
  return v;
}

int parse_positive(const std::string& flag, const std::string& value, int min) {
  return parse_number(flag, value, min, fmt::format("an integer >= {}", min).c_str());
}

bool is_loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

constexpr const char* kNodeHostPrefix = "tprun-node-";

}  // namespace

std::string launch_usage() {
  return "usage: tprun --nproc-per-node N [--nnodes M --node-rank R --master-addr A [--master-port P]\n"
         "             [--join-timeout S] | --hostfile F] PROGRAM ARGS...\n"
         "  Starts N ranks per node under mpirun, exports RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
         "  NODE_RANK (and GROUP_RANK), MASTER_ADDR and MASTER_PORT, OMP_NUM_THREADS (unless set: the cores\n"
         "  other processes leave free, / N; a job with more ranks than free cores gets a warning),\n"
         "  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 and OMPI_MCA_btl_vader_eager_limit=32768 (unless set),\n"
         "  and exits with the job's exit code.\n"
         "  Several nodes: run tprun on every node with the same --nnodes, --nproc-per-node, --master-addr\n"
         "  (node 0's address) and --master-port (default 29500), each with its --node-rank; they form one\n"
         "  job of M*N ranks (rank = node_rank * N + local_rank). Node 0 waits --join-timeout seconds\n"
         "  (default 600) for the others. If a rank or a node fails, every node's tprun exits non-zero.\n"
         "  With --hostfile F instead, node 0 alone starts every node's ranks over ssh.\n"
         "  tprun --version prints tp's version.\n";
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool has_port = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.rfind("--", 0) != 0) break;  // PROGRAM
    if (a == "--") {
      ++i;
      break;
    }
    std::string value;
    bool has_value = false;
    if (size_t eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    if (a == "--help") throw UsageError(launch_usage());
    static const std::vector<std::string> known = {"--nproc-per-node", "--nnodes",   "--node-rank",    "--master-addr",
                                                   "--master-port",    "--hostfile", "--join-timeout"};
    if (std::find(known.begin(), known.end(), a) == known.end())
      throw UsageError(fmt::format("tprun: unknown flag '{}'; flags: {}\n{}", a, fmt::join(known, ", "), launch_usage()));
    if (!has_value) {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("tprun: {} needs a value", a));
      value = args[++i];
    }
    if (a == "--nproc-per-node") o.nproc_per_node = parse_positive(a, value, 1);
    if (a == "--nnodes") o.nnodes = parse_positive(a, value, 1);
    if (a == "--node-rank") o.node_rank = parse_positive(a, value, 0);
    if (a == "--master-addr") o.master_addr = value;
    if (a == "--master-port") {
      o.master_port = parse_positive(a, value, 1);
      has_port = true;
      if (o.master_port > 65535) throw UsageError(fmt::format("tprun: --master-port {} is above 65535", value));
    }
    if (a == "--join-timeout") o.join_timeout_s = parse_number(a, value, 1e-3, "a number of seconds > 0");
    if (a == "--hostfile") o.hostfile = value;
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.command.empty()) throw UsageError("tprun: no PROGRAM given\n" + launch_usage());
  if (o.node_rank >= o.nnodes)
    throw UsageError(fmt::format("tprun: --node-rank {} must be below --nnodes {}", o.node_rank, o.nnodes));
  if (o.rendezvous() && o.master_addr.empty())
    throw UsageError(fmt::format(
        "tprun: --nnodes {} needs --master-addr A: node 0's address, which every node can reach (every node "
        "runs tprun with the same --master-addr and --master-port{}), or --hostfile F to start every node from "
        "node 0 over ssh",
        o.nnodes, has_port ? "" : ", default 29500"));
  return o;
}

std::string node_host_name(int node_rank) {
  return node_rank == 0 ? "localhost" : fmt::format("{}{}", kNodeHostPrefix, node_rank);
}

int node_of_host(const std::string& host) {
  std::string prefix = kNodeHostPrefix;
  TP_CHECK(host.rfind(prefix, 0) == 0 && host.size() > prefix.size() &&
               host.find_first_not_of("0123456789", prefix.size()) == std::string::npos,
           "tprun --rsh-agent: host '{}' is not one of tprun's node names ({}R)", host, prefix);
  return std::stoi(host.substr(prefix.size()));
}

namespace {

// What every rank of this node finds in its environment (tprun sets it in its own).
std::map<std::string, std::string> node_environment(const LaunchOptions& o, const LaunchHost& host) {
  std::map<std::string, std::string> env;
  // Large collectives collapse from page faults without huge pages in malloc.
  env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1";
  // Threads for the cores other processes leave free: on a busy core a rank's
  // threads would wait at every barrier for the one the kernel descheduled.
  const int free_cores = std::max(1, host.cores - host.busy_cores);
  env["OMP_NUM_THREADS"] =
      host.omp_threads_env.empty() ? std::to_string(std::max(1, free_cores / o.nproc_per_node)) : host.omp_threads_env;
  env["TPRUN_BUSY_CORES"] = std::to_string(host.busy_cores);
  // Decode all-reduces a token's hidden state in f32 (4 KiB at width 1024, 16 KiB at 4096). Above Open MPI's
  // shared-memory eager limit (4 KiB, its header included) each message takes the single-copy path, a
  // process_vm_readv system call: a 4 KiB all-reduce took 11-14 us through tp, 4 us with this limit
  // (bench_collectives). 32 KiB is the most the vader transport takes (its max_send_size).
  env["OMPI_MCA_btl_vader_eager_limit"] = host.eager_limit_env.empty() ? "32768" : host.eager_limit_env;
  env["NODE_RANK"] = env["GROUP_RANK"] = std::to_string(o.node_rank);
  if (!o.master_addr.empty()) {
    env["MASTER_ADDR"] = o.master_addr;
    env["MASTER_PORT"] = std::to_string(o.master_port);
  }
  // Each job its own session directory: in the one Open MPI shares between a
  // user's jobs, one job's cleanup can remove it while another job creates its
  // files there ("orte_session_dir failed", open-mpi/ompi#8510).
  if (!host.rundir.empty()) env["OMPI_MCA_orte_tmpdir_base"] = host.rundir;
  if (o.rendezvous() && o.node_rank > 0) {
    // This node's ranks must not share MPI's shared-memory segments with
    // another node's on the same machine (a loopback job): their names only
    // hold the host name, the job id and the local rank.
    env["OMPI_MCA_btl_vader_backing_directory"] = host.rundir;
  }
  return env;
}

// Node 0 of a rendezvous: mpirun over every node, each reached through `tprun --rsh-agent`.
void add_rendezvous(LaunchPlan& plan, const LaunchOptions& o, const LaunchHost& host) {
  plan.env[kAgentSocketEnv] = host.rundir + "/agent.sock";
  plan.hostfile_path = host.rundir + "/hostfile";
  for (int r = 0; r < o.nnodes; ++r)
    plan.hostfile += fmt::format("{} slots={}\n", node_host_name(r), o.nproc_per_node);
  // OpenMPI splits the agent at spaces.
  TP_CHECK(host.self.find_first_of(" \t") == std::string::npos,
           "tprun: its path '{}' holds a space, which mpirun's remote-shell setting cannot carry", host.self);
  // One daemon per node launched straight from mpirun (no tree), kept in the
  // foreground, so the node's tprun sees it end.
  plan.argv.insert(plan.argv.end(), {"--hostfile", plan.hostfile_path, "--mca", "plm_rsh_agent",
                                     host.self + " --rsh-agent", "--mca", "plm_rsh_no_tree_spawn", "1",
                                     "--leave-session-attached"});
  // A loopback job: every node is this machine, and OpenMPI's TCP skips lo by default.
  if (is_loopback(o.master_addr))
    plan.argv.insert(plan.argv.end(), {"--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo"});
}

}  // namespace

LaunchPlan plan_launch(const LaunchOptions& o, const LaunchHost& host) {
  LaunchPlan plan;
  if (o.nnodes > 1 && !o.rendezvous() && o.node_rank != 0) {
    plan.note = fmt::format(
        "tprun: node {} of {}: mpirun on node 0 starts this node's ranks (via its --hostfile); nothing to do here",
        o.node_rank, o.nnodes);
    return plan;
  }
  TP_CHECK(!o.rendezvous() || !host.rundir.empty(), "tprun: a multi-node launch needs a run directory");
  plan.env = node_environment(o, host);
  if (host.busy_cores > 0 && o.nproc_per_node > host.cores - host.busy_cores)
    plan.warning = fmt::format(
        "tprun: warning: other processes keep {} of this machine's {} cores busy, so {} ranks will share cores "
        "with them; a collective waits for the slowest rank (its ranks sleep while they wait, but expect "
        "less than {}x). Fewer ranks (--nproc-per-node {}) may be faster until the machine is free.",
        host.busy_cores, host.cores, o.nproc_per_node, o.nproc_per_node,
        std::max(1, host.cores - host.busy_cores));
  if (o.rendezvous() && o.node_rank > 0) return plan;  // node 0's mpirun sends this node its daemon
  plan.argv = {host.mpirun};
  if (host.root) plan.argv.push_back("--allow-run-as-root");
  if (o.nproc_per_node > host.cores) plan.argv.push_back("--oversubscribe");
  plan.argv.insert(plan.argv.end(), {"--bind-to", "none", "-np", std::to_string(o.nproc_per_node * o.nnodes)});
  if (o.nnodes > 1) plan.argv.insert(plan.argv.end(), {"--map-by", fmt::format("ppr:{}:node", o.nproc_per_node)});
  if (o.rendezvous()) {
    add_rendezvous(plan, o, host);  // each node's ranks inherit their own node's environment: no -x
  } else {
    if (o.nnodes > 1) plan.argv.insert(plan.argv.end(), {"--hostfile", o.hostfile});
    for (const auto& [name, value] : plan.env) plan.argv.insert(plan.argv.end(), {"-x", name});
  }
  plan.argv.insert(plan.argv.end(), {host.self, "--exec-rank"});
  plan.argv.insert(plan.argv.end(), o.command.begin(), o.command.end());
  return plan;
}

std::map<std::string, std::string> rank_environment(const std::map<std::string, std::string>& launcher) {
  auto get = [&](std::initializer_list<const char*> names) -> std::string {
    for (const char* n : names)
      if (auto it = launcher.find(n); it != launcher.end()) return it->second;
    return "";
  };
  std::map<std::string, std::string> env;
  std::string rank = get({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"});
  std::string size = get({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  TP_CHECK(!rank.empty() && !size.empty(),
           "tprun --exec-rank: no launcher variables (OMPI_COMM_WORLD_RANK/SIZE); this mode is for ranks that "
           "mpirun started");
  std::string local_rank = get({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"});
  std::string local_size = get({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"});
  env["RANK"] = rank;
  env["WORLD_SIZE"] = size;
  env["LOCAL_RANK"] = local_rank.empty() ? rank : local_rank;
  env["LOCAL_WORLD_SIZE"] = local_size.empty() ? size : local_size;
  return env;
}

}  // namespace tp::launcher
