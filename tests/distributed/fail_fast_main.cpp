// A job in which the last rank fails while the others wait in a collective.
// fail_fast.sh checks the whole job ends non-zero within seconds.
//   fail_fast_main throw|kill|exit|early|ok
#include <csignal>
#include <cstdio>
#include <cstring>

#include "tp/distributed/process_group.h"

int main(int argc, char** argv) {
  tp::dist::init(&argc, &argv);
  const char* mode = argc > 1 ? argv[1] : "ok";
  tp::dist::ProcessGroup& g = tp::dist::world();
  bool culprit = g.rank() == g.size() - 1;
  tp::Tensor t = tp::Tensor::full({1024}, 1.0);
  g.all_reduce(t);  // everyone is up
  if (culprit && std::strcmp(mode, "throw") == 0) throw tp::Error("deliberate failure on the last rank");
  if (culprit && std::strcmp(mode, "kill") == 0) std::raise(SIGKILL);
  if (culprit && std::strcmp(mode, "exit") == 0) return 3;
  if (culprit && std::strcmp(mode, "early") == 0) return 0;  // "success", but the others still wait
  g.all_reduce(t);  // the others wait here for the culprit
  g.barrier();
  if (g.rank() == 0) std::printf("all ranks finished: %g\n", t.at(0));
  return 0;
}
