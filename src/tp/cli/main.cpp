// `tp`: one executable, one subcommand per file (cmd_*.cpp).
// Exit codes: 0 ok, 1 runtime error, 2 usage error.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <omp.h>

#include "tp/cli/command.h"
#include "tp/core/cpu_load.h"
#include "tp/distributed/process_group.h"
#include "tp/core/error.h"
#include "tp/version.h"

namespace tp::cli {

std::vector<CommandSpec>& commands() {
  static std::vector<CommandSpec> list;
  return list;
}

int launcher_rank() {
  for (const char* var : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

}  // namespace tp::cli

namespace {

// Prints the error once per failing rank and takes the whole job down: other
// ranks may be blocked in a collective waiting for this one.
[[noreturn]] void die(const std::string& message, int code) { tp::dist::abort_job(message, code); }

// Without OMP_NUM_THREADS (tprun sets it), OpenMP would start a thread per core;
// on cores that other processes keep busy those threads wait at every barrier
// for the one the kernel descheduled (with one competing process on 2 cores, 2
// threads decoded 0.98 tok/s against 1 thread's 23.7 in the same run:
// bench/models/run_contention_bench.py, bench/RESULTS.md). Use the cores left free.
void size_threads_for_the_free_cores() {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  const int cores = omp_get_num_procs();
  if (cores <= 1) return;
  const int busy = tp::busy_cores(cores);
  if (busy > 0) omp_set_num_threads(std::max(1, cores - busy));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tp: tensor-parallel inference and training of Hugging Face transformer models"};
  app.set_version_flag("--version", std::string("tp ") + TP_VERSION);
  app.require_subcommand(1);
  std::map<CLI::App*, tp::cli::RunFn> runs;
  for (auto& spec : tp::cli::commands()) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    runs[sub] = spec.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  size_threads_for_the_free_cores();
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const tp::UsageError& e) {
    die(e.what(), 2);
  } catch (const std::exception& e) {
    die(e.what(), 1);
  }
  return 0;
}
