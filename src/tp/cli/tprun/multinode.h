#pragma once
// The processes of a multi-node tprun (design in tp/cli/tprun/launch.h, messages in
// tp/cli/tprun/rendezvous.h). Each returns the exit code tprun exits with: the job's
// (mpirun's), or non-zero when a node or this node's daemon failed. Whatever
// goes wrong on one node ends every node's tprun within seconds:
//   - a rank fails: mpirun aborts the job and exits non-zero; node 0 sends that
//     code to every node ("done"), whose tprun exits with it;
//   - a node's tprun dies or its connection breaks: node 0 stops mpirun (which
//     takes every rank down) and exits non-zero; the others hear "done";
//   - node 0's tprun dies: mpirun gets SIGTERM (parent-death signal), and the
//     other nodes, seeing the connection close, stop their daemons and exit 1.
#include <string>
#include <vector>

#include "tp/cli/tprun/launch.h"

namespace tp::launcher {

// A private directory for one launch (removed with everything in it on destruction,
// so it outlives only a SIGKILLed tprun).
class RunDir {
 public:
  // Under $TMPDIR when set, else /dev/shm when writable (on nodes > 0 it holds
  // MPI's shared-memory segments), else /tmp.
  RunDir();
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One node: runs plan.argv (mpirun) and waits for it, passing INT/TERM/HUP on
// to it, so that the caller's RunDir (MPI's session files) goes when the job
// ends. plan.env must already be in the environment.
int run_single_node(const LaunchPlan& plan);
// Node 0: waits for the other nodes, runs plan.argv (mpirun) and relays the
// daemon launches of its agent to them. plan.env must already be in the environment.
int run_node0(const LaunchOptions& options, const LaunchPlan& plan);
// Node R > 0: joins node 0 and runs the daemon node 0's mpirun sends.
int run_node(const LaunchOptions& options);
// `tprun --rsh-agent HOST COMMAND...`, mpirun's remote shell: has node 0's
// tprun run COMMAND on the node HOST names and exits with its status.
int run_rsh_agent(const std::vector<std::string>& args);

}  // namespace tp::launcher
