#include "tp/cli/tprun/multinode.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "tp/cli/tprun/rendezvous.h"
#include "tp/core/error.h"

namespace tp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

volatile sig_atomic_t caught_signal = 0;

void on_signal(int sig) { caught_signal = sig; }

// INT/TERM/HUP stop this node's child (mpirun or the daemon) rather than
// killing tprun outright, so the other nodes hear how it ended.
void catch_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

int take_signal() { return std::exchange(caught_signal, 0); }

// Ends a wait for the other nodes when tprun is interrupted.
void stop_on_signal() {
  if (int sig = take_signal()) fail("interrupted by signal {} ({}) before the job started", sig, strsignal(sig));
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

struct Fd {
  int fd;
  ~Fd() { close(fd); }
};

// A child process that dies with tprun (parent-death signal) and that is
// stopped with a signal, then SIGKILL if it is still there after a grace period.
class Child {
 public:
  // own_group: the child leads a new process group, and signals go to all of it.
  Child(const std::vector<std::string>& argv, bool own_group, int death_signal) : group_(own_group) {
    pid_t parent = getpid();
    pid_ = fork();
    TP_CHECK(pid_ >= 0, "tprun: fork failed: {}", std::strerror(errno));
    if (pid_ > 0) return;
    if (own_group) setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, death_signal);
    if (getppid() != parent) _exit(1);  // tprun died before prctl
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "tprun: error: cannot run '%s': %s\n", args[0], std::strerror(errno));
    _exit(127);
  }

  // True once it has exited (status() is then its exit code); escalates a stop.
  bool exited() {
    int status = 0;
    if (!status_ && waitpid(pid_, &status, WNOHANG) == pid_) status_ = exit_code(status);
    if (!status_ && kill_at_ && Clock::now() > *kill_at_) {
      kill(target(), SIGKILL);
      kill_at_.reset();
    }
    return status_.has_value();
  }
  int status() const { return *status_; }

  void stop(int sig, double grace_s) {
    if (status_ || kill_at_) return;
    kill(target(), sig);
    kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int>(grace_s * 1000));
  }

 private:
  pid_t target() const { return group_ ? -pid_ : pid_; }

  pid_t pid_ = -1;
  bool group_;
  std::optional<int> status_;
  std::optional<Clock::time_point> kill_at_;
};

// Waits up to 100 ms for any of `channels` (open ones) or `extra_fd` to be readable.
void wait_readable(const std::vector<Channel*>& channels, int extra_fd) {
  std::vector<pollfd> fds;
  if (extra_fd >= 0) fds.push_back({extra_fd, POLLIN, 0});
  for (Channel* c : channels)
    if (c->is_open()) fds.push_back({c->fd(), POLLIN, 0});
  poll(fds.data(), fds.size(), 100);
}

// Node 0's side of one agent request: "launch <host> <command>".
void relay_launch(const std::string& request, std::vector<Channel>& nodes, std::vector<Channel>& agents,
                  Channel& agent) {
  auto [verb, rest] = split_message(request);
  auto [host, command] = split_message(rest);
  int node = -1;
  try {
    node = node_of_host(host);
  } catch (const Error& e) {
    std::fprintf(stderr, "tprun: error: %s\n", e.what());
  }
  if (verb != "launch" || node < 1 || node >= static_cast<int>(nodes.size()) || !nodes[node].send("start " + command)) {
    agent.send("exited 255");  // what ssh returns when it cannot reach the host
    agent.close();
    return;
  }
  agents[node] = std::move(agent);
}

}  // namespace

RunDir::RunDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp && *tmp ? tmp : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  std::string name = base + "/tprun-XXXXXX";
  TP_CHECK(mkdtemp(name.data()) != nullptr, "tprun: cannot create a directory under {}: {}", base,
           std::strerror(errno));
  path_ = name;
}

RunDir::~RunDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

int run_single_node(const LaunchPlan& plan) {
  catch_signals();
  // A Ctrl-C at the terminal reaches mpirun too (one process group): sending
  // it again would make mpirun skip its orderly abort.
  const bool terminal_sends_to_all = isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp();
  Child mpirun(plan.argv, false, SIGTERM);
  while (!mpirun.exited()) {
    if (int sig = take_signal(); sig && !(sig == SIGINT && terminal_sends_to_all)) mpirun.stop(sig, 10);
    poll(nullptr, 0, 50);
  }
  return mpirun.status();
}

int run_node0(const LaunchOptions& o, const LaunchPlan& plan) {
  catch_signals();
  std::vector<Channel> nodes;
  {
    Fd listener{listen_tcp(o.master_port)};
    std::fprintf(stderr, "tprun: node 0: waiting up to %g s for %d more node(s) at %s:%d\n", o.join_timeout_s,
                 o.nnodes - 1, o.master_addr.c_str(), o.master_port);
    nodes = gather_nodes(listener.fd, o, stop_on_signal);
  }
  std::ofstream(plan.hostfile_path) << plan.hostfile;
  Fd agent_listener{listen_unix(plan.env.at(kAgentSocketEnv))};
  Child mpirun(plan.argv, false, SIGTERM);
  std::vector<Channel> pending;               // agents that have not said which node yet
  std::vector<Channel> agents(o.nnodes);      // the agent waiting for node r's daemon
  bool lost = false;
  while (!mpirun.exited()) {
    if (int sig = take_signal()) mpirun.stop(sig, 10);
    std::vector<Channel*> watched;
    for (auto* list : {&pending, &nodes})
      for (Channel& c : *list) watched.push_back(&c);
    wait_readable(watched, agent_listener.fd);
    pollfd accept_ready{agent_listener.fd, POLLIN, 0};
    if (poll(&accept_ready, 1, 0) > 0)
      if (Channel c = accept_channel(agent_listener.fd); c.is_open()) pending.push_back(std::move(c));
    for (Channel& agent : pending) {
      std::vector<std::string> lines;
      if (agent.receive(lines) && !lines.empty()) relay_launch(lines.front(), nodes, agents, agent);
    }
    std::erase_if(pending, [](const Channel& c) { return !c.is_open(); });
    for (int r = 1; r < o.nnodes; ++r) {
      if (!nodes[r].is_open()) continue;
      std::vector<std::string> lines;
      if (!nodes[r].receive(lines) && !lost) {
        std::fprintf(stderr,
                     "tprun: error: node %d (%s) left before the job ended (its tprun exited or the connection "
                     "broke); stopping the job\n",
                     r, nodes[r].peer().c_str());
        lost = true;
        mpirun.stop(SIGTERM, 10);
        agents[r].send("exited 255");  // its daemon is as good as gone
      }
      for (const std::string& line : lines)
        if (split_message(line).first == "exited") agents[r].send(line);
    }
  }
  int code = mpirun.status() == 0 && lost ? 1 : mpirun.status();
  for (Channel& c : nodes) c.send(fmt::format("done {}", code));
  return code;
}

int run_node(const LaunchOptions& o) {
  catch_signals();
  Clock::time_point start = Clock::now();
  Channel node0 = join_job(o, stop_on_signal);
  std::fprintf(stderr, "tprun: node %d: joined the job at %s (the ranks' output shows on node 0)\n", o.node_rank,
               node0.peer().c_str());
  std::string command;
  while (command.empty()) {
    stop_on_signal();
    std::optional<std::string> line = node0.next_line(0.2);
    if (!line) {
      TP_CHECK(node0.is_open(), "node {}: node 0 ({}) hung up before the job started", o.node_rank, node0.peer());
      TP_CHECK(seconds_since(start) < o.join_timeout_s,
               "node {}: joined node 0 at {}, but the job did not start within {:g} s", o.node_rank, node0.peer(),
               o.join_timeout_s);
      continue;
    }
    auto [verb, rest] = split_message(*line);
    if (verb == "error") fail("{}", rest);
    if (verb == "done") return std::atoi(rest.c_str());  // mpirun ended before it reached this node
    if (verb == "start") command = rest;
  }
  Child daemon({"/bin/sh", "-c", command}, true, SIGKILL);
  std::optional<int> job_code;
  std::optional<Clock::time_point> daemon_end, done_at;
  int stopped_by = 0;
  bool lost = false;
  for (;;) {
    if (daemon.exited() && !daemon_end) {
      node0.send(fmt::format("exited {}", daemon.status()));
      daemon_end = Clock::now();
    }
    // Done once node 0 said how the job ended, or it is gone, or silent for 30 s after the daemon ended
    // (or at once when this node was told to stop: node 0 learns it from the closed connection).
    if (daemon_end && (job_code || stopped_by || !node0.is_open() || seconds_since(*daemon_end) > 30)) break;
    if (int sig = take_signal()) {
      stopped_by = sig;
      daemon.stop(SIGTERM, 5);
    }
    if (done_at && seconds_since(*done_at) > 5) daemon.stop(SIGTERM, 3);  // mpirun ended; its daemon lingers
    std::optional<std::string> line = node0.next_line(0.1);
    if (line && split_message(*line).first == "done") {
      job_code = std::atoi(split_message(*line).second.c_str());
      done_at = Clock::now();
    }
    if (!line && !node0.is_open() && !job_code && !lost) {
      std::fprintf(stderr, "tprun: error: node %d: lost node 0 (%s) before the job ended; stopping this node's ranks\n",
                   o.node_rank, node0.peer().c_str());
      lost = true;
      daemon.stop(SIGTERM, 5);
    }
  }
  if (stopped_by) return 128 + stopped_by;
  if (!job_code) {
    if (!lost)
      std::fprintf(stderr, "tprun: error: node %d: node 0 did not say how the job ended\n", o.node_rank);
    return 1;
  }
  if (*job_code != 0)
    std::fprintf(stderr, "tprun: node %d: the job failed with exit code %d (node 0's output says why)\n", o.node_rank,
                 *job_code);
  return *job_code != 0 ? *job_code : daemon.status();
}

int run_rsh_agent(const std::vector<std::string>& args) {
  TP_CHECK(args.size() >= 2, "tprun --rsh-agent HOST COMMAND...: mpirun's remote shell in a multi-node tprun job");
  const char* socket = std::getenv(kAgentSocketEnv);
  TP_CHECK(socket != nullptr, "tprun --rsh-agent: {} is not set; only node 0's tprun starts this", kAgentSocketEnv);
  std::string command;
  for (size_t i = 1; i < args.size(); ++i) command += (i > 1 ? " " : "") + args[i];
  Channel tprun = connect_unix(socket);
  tprun.send(fmt::format("launch {} {}", args[0], command));
  for (;;) {
    std::optional<std::string> line = tprun.next_line(60);
    if (!line && !tprun.is_open()) return 255;
    if (line && split_message(*line).first == "exited") return std::atoi(split_message(*line).second.c_str());
  }
}

}  // namespace tp::launcher
