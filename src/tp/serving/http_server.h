#pragma once
// The HTTP front end of `tp serve` (rank 0): OpenAI's /v1/completions,
// /v1/chat/completions (both also as server-sent event streams), /v1/models and
// /health, over cpp-httplib with one thread per connection. Handlers only
// validate, tokenize, queue the request on the Scheduler and turn the tokens
// that come back into text; the model runs on the main thread (Engine::run).
//
// Not in the library tp_lib: this is the one file that needs cpp-httplib.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tp/serving/openai_api.h"
#include "tp/serving/scheduler.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp::serving {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;             // 0: any free port (see HttpServer::port)
  std::string api_key;         // non-empty: /v1/* needs "Authorization: Bearer <key>"
  std::string model_name;      // what /v1/models lists and requests must name (or leave out)
  std::vector<int64_t> eos_token_ids;
  int64_t vocab_size = 0;      // token ids in prompts must be below it
  bool log_requests = true;    // one line per request on stderr
  int threads = 128;           // connections served at once (a stream holds its thread)
};

// The model's chat template: messages -> prompt text, ending with the
// assistant's turn (add_generation_prompt). Unset: the model has none, and
// /v1/chat/completions answers 400.
using ChatRenderer = std::function<std::string(const std::vector<ChatMessage>&)>;

class HttpServer {
 public:
  // `tokenizer` may be empty: prompts must then be token ids, and the text of
  // a completion is its token ids ("12 7 99 ").
  HttpServer(ServerOptions options, Scheduler& scheduler, std::optional<Tokenizer> tokenizer, ChatRenderer chat);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (error naming them when that fails) and serves on a thread of its own.
  void start();
  // Stops accepting and waits for the server thread (streams end first: stop the scheduler before).
  void stop();
  int port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tp::serving
