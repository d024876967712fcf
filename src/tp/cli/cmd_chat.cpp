// tp chat: an interactive multi-turn chat in the terminal. Rank 0 reads each
// user line from stdin, renders the whole history with the model's chat
// template (add_generation_prompt), tokenizes it without special tokens (the
// template writes BOS itself, as Transformers' apply_chat_template(tokenize=True)
// does) and broadcasts the ids; every rank then runs the same generate loop,
// rank 0 streaming the answer. The answer joins the history. `/exit` or EOF
// ends the session; Ctrl-C (SIGINT to rank 0) ends only the current answer:
// the flag rides with the token broadcast, so all ranks stop at the same token.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "tp/chat/chat_template.h"
#include "tp/cli/command.h"
#include "tp/cli/common.h"
#include "tp/distributed/process_group.h"
#include "tp/generation/generate.h"
#include "tp/tokenizer/streaming_decoder.h"

namespace tp::cli {
namespace {

struct ChatFlags {
  ModelFlags model;
  SamplingFlags sampling{.max_new_tokens = 256};
  std::string system;
  std::string adapter;
  bool show_prompt = false;
};

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

// Rank 0's SIGINT stops the answer; the other ranks ignore it and stop with rank 0.
void install_sigint(bool rank0) {
  struct sigaction sa {};
  sa.sa_handler = rank0 ? on_sigint : SIG_IGN;
  sa.sa_flags = SA_RESTART;  // a Ctrl-C at the input prompt does not break the read
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
}

// What rank 0 sends each turn: the prompt ids, or an empty list to skip the
// turn, or `end` to close the session.
struct Turn {
  bool end = false;
  std::vector<int64_t> ids;
};

Turn broadcast_turn(dist::ProcessGroup& group, Turn turn) {
  Tensor n = Tensor::from_ints({turn.end ? -1 : static_cast<int64_t>(turn.ids.size())}, {1});
  group.broadcast(n, 0);
  const int64_t count = n.to_int_vector()[0];
  if (count <= 0) return {count < 0, {}};
  Tensor ids = group.rank() == 0 ? Tensor::from_ints(turn.ids, {count}) : Tensor::zeros({count}, DType::I64);
  group.broadcast(ids, 0);
  return {false, ids.to_int_vector()};
}

// Rank 0: the next user line, or nullopt at EOF or /exit.
std::optional<std::string> read_user_line(bool interactive) {
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) return std::nullopt;
    if (line == "/exit") return std::nullopt;
    if (!line.empty()) return line;
  }
}

int run_chat(const ChatFlags& f) {
  const std::filesystem::path dir = f.model.model;
  if (!std::filesystem::exists(dir / "tokenizer.json"))
    throw UsageError(fmt::format("tp chat needs {} (and a chat template)", (dir / "tokenizer.json").string()));
  const Tokenizer tokenizer = Tokenizer::from_model_dir(dir);
  const chat::ChatTemplate chat_template = chat::ChatTemplate::from_model_dir(dir);
  PretrainedModel model = load_model(f.model, f.adapter);
  // Every rank of the model's mesh takes part in a turn: under expert parallelism
  // with tp_size < ranks there are several tp rank 0s, and only one reads stdin.
  dist::ProcessGroup& group = model.mesh().root_group();
  const bool rank0 = group.rank() == 0;
  install_sigint(rank0);
  const bool interactive = rank0 && isatty(STDIN_FILENO);
  const int64_t max_positions = model.config().max_position_embeddings;

  generation::GenerateOptions options;
  options.sampling = sampling_options(f.sampling);
  options.eos_token_ids = generation::default_eos_token_ids(model, &tokenizer);
  options.should_stop = [] { return g_interrupted.load(); };

  std::vector<chat::Message> history;
  if (!f.system.empty()) history.push_back({"system", f.system});
  while (true) {
    Turn turn;
    if (rank0) {
      std::optional<std::string> line = read_user_line(interactive);
      g_interrupted.store(false);  // a Ctrl-C from now on stops this answer
      if (!line) {
        turn.end = true;
      } else {
        history.push_back({"user", *line});
        const std::string prompt = chat_template.apply(history, /*add_generation_prompt=*/true);
        if (f.show_prompt) fmt::print(stderr, "[prompt] {}\n", nlohmann::json(prompt).dump());
        turn.ids = tokenizer.encode(prompt, /*add_special_tokens=*/false);
        if (max_positions > 0 && static_cast<int64_t>(turn.ids.size()) >= max_positions) {
          fmt::print(stderr, "[error] the conversation ({} tokens) no longer fits the model's {} positions; "
                             "start a new session\n", turn.ids.size(), max_positions);
          history.pop_back();
          turn.ids.clear();
        }
      }
    }
    turn = broadcast_turn(group, std::move(turn));
    if (turn.end) break;
    if (turn.ids.empty()) continue;
    const auto prompt_len = static_cast<int64_t>(turn.ids.size());
    options.max_new_tokens = max_positions > 0 ? std::min(f.sampling.max_new_tokens, max_positions - prompt_len)
                                               : f.sampling.max_new_tokens;

    StreamingDecoder streamer(tokenizer, /*skip_special_tokens=*/true);
    streamer.prime(turn.ids);
    auto on_token = [&](int64_t, int64_t token) {
      if (!rank0 || f.model.json) return;
      std::fputs(streamer.push(token).c_str(), stdout);
      std::fflush(stdout);
    };
    generation::GenerateResult result = generation::generate(model, {turn.ids}, options, on_token);
    if (!rank0) continue;
    if (result.stopped) fmt::print(stderr, "[interrupted]\n");
    std::vector<int64_t> answer = result.tokens[0];
    if (!answer.empty() && std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), answer.back()) !=
                               options.eos_token_ids.end())
      answer.pop_back();
    history.push_back({"assistant", tokenizer.decode(answer, /*skip_special_tokens=*/true)});
    if (f.model.json) {  // one line per turn instead of the stream
      nlohmann::ordered_json j;
      j["answer"] = history.back().content;
      j["token_ids"] = result.tokens[0];
      j["stopped"] = result.stopped;
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    } else {
      std::fputs((streamer.flush() + "\n").c_str(), stdout);
      std::fflush(stdout);
    }
  }
  return 0;
}

Registrar reg("chat", "Interactive multi-turn chat with the model's chat template (stdin on rank 0)", [](CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  add_model_flags(app, f->model);
  add_sequence_parallel_flag(app, f->model);
  add_adapter_flag(app, f->adapter);
  add_sampling_flags(app, f->sampling);
  app.add_option("--system", f->system, "system message that opens the conversation");
  // --json (of add_model_flags): a JSON line per turn, {"answer", "token_ids", "stopped"}, instead of the stream.
  app.add_flag("--show-prompt", f->show_prompt, "print each rendered prompt to stderr as a JSON string: [prompt] \"...\"");
  return [f] { return run_chat(*f); };
});

}  // namespace
}  // namespace tp::cli
