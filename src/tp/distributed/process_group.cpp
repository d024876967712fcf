// Runtime start-up: MPI when a launcher started us, a lone process otherwise.
#include "tp/distributed/process_group.h"

#include <mpi.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "tp/distributed/mpi_process_group.h"

namespace tp::dist {
namespace {

MpiProcessGroup* world_group = nullptr;  // never destroyed: ranks may hold it past main

const char* env(const char* name) { return std::getenv(name); }

// mpirun (OpenMPI, MPICH/Hydra, Slurm PMI) sets one of these in each rank.
bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (env(var)) return true;
  return false;
}

// torchrun-style variables for code that reads them (tprun exports them too;
// plain `mpirun` does not).
void export_rank_env(int rank, int size) {
  auto set = [](const char* name, const std::string& value) { setenv(name, value.c_str(), 0); };
  set("RANK", std::to_string(rank));
  set("WORLD_SIZE", std::to_string(size));
  const char* local_rank = env("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* local_size = env("OMPI_COMM_WORLD_LOCAL_SIZE");
  set("LOCAL_RANK", local_rank ? local_rank : std::to_string(rank));
  set("LOCAL_WORLD_SIZE", local_size ? local_size : std::to_string(size));
}

// A failing exit (any rank returning non-zero from main, or calling exit(n))
// aborts the whole job: MPI_Finalize would wait for peers that may be blocked in
// a collective for this rank forever. A clean exit waits for every rank to exit
// too (at most TP_EXIT_WAIT_S seconds, default 300: a rank that returned while
// the others still wait in a collective it skipped must not hang the job), then
// finalizes.
void finish_at_exit(int status, void*) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (status != 0 && size > 1) MPI_Abort(MPI_COMM_WORLD, status);
  if (size > 1) {
    double limit = 300;
    if (const char* v = env("TP_EXIT_WAIT_S")) limit = std::atof(v);
    MPI_Request request;
    MPI_Ibarrier(MPI_COMM_WORLD, &request);
    int done = 0;
    double start = MPI_Wtime();
    while (!done) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (!done && MPI_Wtime() - start > limit)
        abort_job(fmt::format("this rank exited normally but other ranks did not exit within {} s (are they waiting "
                              "in a collective this rank skipped?)",
                              limit));
      if (!done) usleep(200);
    }
  }
  MPI_Finalize();
}

// An exception nobody caught must not leave the other ranks blocked in a collective.
[[noreturn]] void on_terminate() {
  std::string message = "terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      message = ex.what();
    } catch (...) {
      message = "unknown exception";
    }
  }
  abort_job(message, 1);
}

}  // namespace

void init(int* argc, char*** argv) {
  if (world_group != nullptr) return;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized && launched_by_mpi()) {
    int provided = 0;
    // Only the thread that called init talks to MPI; OpenMP threads compute.
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    TP_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed with code {}", rc);
    initialized = 1;
    on_exit(finish_at_exit, nullptr);
  }
  if (initialized) {
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);  // our own context: user MPI traffic cannot interleave with ours
    world_group = new MpiProcessGroup(comm, true);
  } else {
    world_group = new MpiProcessGroup(MPI_COMM_NULL, false);
  }
  export_rank_env(world_group->rank(), world_group->size());
  std::set_terminate(on_terminate);
}

ProcessGroup& world() {
  if (world_group == nullptr) init();
  return *world_group;
}

int world_rank() { return world().rank(); }
int world_size() { return world().size(); }
bool is_distributed() { return world().size() > 1; }

void on_rank0(ProcessGroup& group, const std::string& what, const std::function<void()>& action) {
  std::string error;
  if (group.rank() == 0) {
    try {
      action();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  Tensor failed = Tensor::from_ints({error.empty() ? 0 : 1}, {1});
  group.broadcast(failed, 0);
  if (failed.to_int_vector()[0] == 0) return;
  if (error.empty()) error = "failed on rank 0 (its message says why)";
  fail("{}{}", what.empty() ? "" : what + ": ", error);
}

void abort_job(const std::string& message, int code) {
  int rank = 0;
  if (const char* r = env("OMPI_COMM_WORLD_RANK")) rank = std::atoi(r);
  else if (const char* r2 = env("RANK")) rank = std::atoi(r2);
  std::fprintf(stderr, "[rank %d] error: %s\n", rank, message.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int size = 1;
  if (initialized && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::fflush(nullptr);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // no exit handlers: they could wait on peers
}

}  // namespace tp::dist
