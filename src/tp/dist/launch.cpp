#include "tp/dist/launch.h"

#include <algorithm>

#include "tp/tensor/error.h"

namespace tp::dist {
namespace {

int parse_positive(const std::string& flag, const std::string& value, int min) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || v < min)
    throw UsageError(fmt::format("{} expects an integer >= {}, got '{}'", flag, min, value));
  return v;
}

}  // namespace

std::string launch_usage() {
  return "usage: tprun --nproc-per-node N [--nnodes M --node-rank R --master-addr A --hostfile F] PROGRAM ARGS...\n"
         "  Starts N ranks per node under mpirun, exports RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
         "  OMP_NUM_THREADS (cores / N unless set) and GLIBC_TUNABLES=glibc.malloc.hugetlb=1, and exits\n"
         "  with the job's exit code. Multi-node: run on node 0 with --hostfile listing the nodes\n"
         "  (mpirun starts the other nodes' ranks over ssh); other node ranks have nothing to do.\n";
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
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
    static const std::vector<std::string> known = {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
                                                   "--hostfile"};
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
    if (a == "--hostfile") o.hostfile = value;
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.command.empty()) throw UsageError("tprun: no PROGRAM given\n" + launch_usage());
  if (o.node_rank >= o.nnodes)
    throw UsageError(fmt::format("tprun: --node-rank {} must be below --nnodes {}", o.node_rank, o.nnodes));
  return o;
}

LaunchPlan plan_launch(const LaunchOptions& o, const std::string& mpirun, const std::string& self, int cores,
                       bool root, const std::string& omp_threads_env) {
  LaunchPlan plan;
  if (o.nnodes > 1 && o.node_rank != 0) {
    plan.note = fmt::format(
        "tprun: node {} of {}: mpirun on node 0 starts this node's ranks (via its --hostfile); nothing to do here",
        o.node_rank, o.nnodes);
    return plan;
  }
  if (o.nnodes > 1 && o.hostfile.empty())
    throw UsageError(fmt::format("tprun: --nnodes {} needs --hostfile F listing the {} nodes (one host per line, "
                                 "node 0 first{}); mpirun starts every node's ranks from node 0",
                                 o.nnodes, o.nnodes, o.master_addr.empty() ? "" : ", e.g. " + o.master_addr));
  int total = o.nproc_per_node * o.nnodes;
  plan.argv = {mpirun};
  if (root) plan.argv.push_back("--allow-run-as-root");
  if (o.nproc_per_node > cores) plan.argv.push_back("--oversubscribe");
  plan.argv.insert(plan.argv.end(), {"--bind-to", "none", "-np", std::to_string(total)});
  if (o.nnodes > 1)
    plan.argv.insert(plan.argv.end(),
                     {"--hostfile", o.hostfile, "--map-by", "ppr:" + std::to_string(o.nproc_per_node) + ":node"});
  // Large collectives collapse from page faults without huge pages in malloc.
  plan.env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1";
  plan.env["OMP_NUM_THREADS"] =
      omp_threads_env.empty() ? std::to_string(std::max(1, cores / o.nproc_per_node)) : omp_threads_env;
  if (!o.master_addr.empty()) plan.env["MASTER_ADDR"] = o.master_addr;
  for (const auto& [name, value] : plan.env) plan.argv.insert(plan.argv.end(), {"-x", name});
  plan.argv.insert(plan.argv.end(), {self, "--exec-rank"});
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

}  // namespace tp::dist
