#pragma once
// `tp` subcommands register themselves: each cmd_*.cpp defines one static
// Registrar with its name, help and a setup function that adds the flags to its
// CLI11 sub-app and returns the function to run (its exit code).
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tp::cli {

using RunFn = std::function<int()>;
using SetupFn = std::function<RunFn(CLI::App& sub)>;

struct CommandSpec {
  std::string name;
  std::string help;
  SetupFn setup;
};

std::vector<CommandSpec>& commands();

struct Registrar {
  Registrar(std::string name, std::string help, SetupFn setup) {
    commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

// This process's rank as the launcher told it (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK), else 0.
int launcher_rank();

}  // namespace tp::cli
