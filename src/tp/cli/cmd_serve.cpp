// tp serve: an OpenAI-compatible HTTP server. The model mesh's root rank serves
// HTTP and schedules; every rank runs the model loop on its main thread
// (tp/serving/engine.h). SIGINT / SIGTERM (mpirun forwards them to every rank)
// end it cleanly: the root sees the signal between steps and broadcasts a stop plan.
#include <omp.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "tp/cli/command.h"
#include "tp/chat/chat_template.h"
#include "tp/cli/common.h"
#include "tp/distributed/process_group.h"
#include "tp/serving/engine.h"
#include "tp/serving/http_server.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) { g_stop = 1; }

struct ServeFlags {
  ModelFlags model;
  std::string adapter;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  int64_t max_num_seqs = 8;
  int64_t max_num_batched_tokens = 8192;
  std::optional<int64_t> max_model_len;
  bool disable_log_requests = false;
};

// The model's chat template as the server's renderer; none when the model has
// no template (the chat endpoint then answers 400).
serving::ChatRenderer chat_renderer(const std::filesystem::path& dir, bool verbose) {
  try {
    auto tmpl = std::make_shared<const chat::ChatTemplate>(chat::ChatTemplate::from_model_dir(dir));
    return [tmpl](const std::vector<chat::Message>& messages) {
      return tmpl->apply(messages, /*add_generation_prompt=*/true);
    };
  } catch (const Error& e) {
    if (verbose) fmt::print(stderr, "tp serve: no chat template ({}): /v1/chat/completions answers 400\n", e.what());
  }
  return {};
}

// The context a sequence slot holds: the flag, else the model's, at most 4096
// by default (the KV cache is allocated up front for every slot).
int64_t max_model_len(const ServeFlags& f, const ModelConfig& config) {
  const int64_t context = config.max_position_embeddings > 0 ? config.max_position_embeddings : 4096;
  if (!f.max_model_len) return std::min<int64_t>(context, 4096);
  if (*f.max_model_len < 2 || *f.max_model_len > context)
    throw UsageError(fmt::format("--max-model-len {} must be in [2, {}] (the model's max_position_embeddings)",
                                 *f.max_model_len, context));
  return *f.max_model_len;
}

int run_serve(const ServeFlags& f) {
  if (f.max_num_seqs < 1) throw UsageError(fmt::format("--max-num-seqs must be at least 1, got {}", f.max_num_seqs));
  if (f.max_num_batched_tokens < f.max_num_seqs)
    throw UsageError(fmt::format("--max-num-batched-tokens {} must be at least --max-num-seqs {}",
                                 f.max_num_batched_tokens, f.max_num_seqs));
  if (f.port < 0 || f.port > 65535) throw UsageError(fmt::format("--port {} is not a TCP port (0-65535)", f.port));
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not the end of the server

  // The HTTP threads need a core now and then for every token they send; when
  // OpenMP's threads hold every core (spinning at their barriers), each
  // preemption stalls a whole parallel region. Measured on 2 cores, 8 streaming
  // clients: 385 tokens/s with 2 threads, 7000 with 1. So one core is left to
  // them unless OMP_NUM_THREADS says otherwise (tprun sets it: cores / ranks).
  if (std::getenv("OMP_NUM_THREADS") == nullptr && omp_get_max_threads() > 1)
    omp_set_num_threads(omp_get_max_threads() - 1);
  const std::filesystem::path dir = f.model.model;
  std::optional<Tokenizer> tokenizer;
  if (std::filesystem::exists(dir / "tokenizer.json")) tokenizer = Tokenizer::from_model_dir(dir);
  PretrainedModel model = load_model(f.model, f.adapter);
  serving::SchedulerOptions options{.max_num_seqs = f.max_num_seqs,
                                    .max_num_batched_tokens = f.max_num_batched_tokens,
                                    .max_model_len = max_model_len(f, model.config())};
  serving::Engine engine(model, options);
  std::unique_ptr<serving::HttpServer> server;
  if (engine.root()) {
    serving::ServerOptions so;
    so.host = f.host;
    so.port = f.port;
    so.api_key = f.api_key;
    so.model_name = f.served_model_name.empty() ? std::filesystem::absolute(dir).lexically_normal().filename().string()
                                                : f.served_model_name;
    if (so.model_name.empty()) so.model_name = std::filesystem::absolute(dir).parent_path().filename().string();
    so.eos_token_ids = tokenizer ? tokenizer->eos_token_ids() : model.config().eos_token_ids;
    if (so.eos_token_ids.empty()) so.eos_token_ids = model.config().eos_token_ids;
    so.vocab_size = model.config().vocab_size;
    so.log_requests = !f.disable_log_requests;
    so.threads = static_cast<int>(std::max<int64_t>(64, 4 * f.max_num_seqs));
    server = std::make_unique<serving::HttpServer>(so, engine.scheduler(), tokenizer,
                                                   tokenizer ? chat_renderer(dir, true) : serving::ChatRenderer{});
    server->start();
    fmt::print(stderr,
               "tp serve: '{}' on http://{}:{} ({}, {} sequence slots of {} tokens, KV cache {:.1f} MiB per "
               "rank, at most {} tokens per step)\n",
               so.model_name, f.host, server->port(),
               model.ep_size() > 1 ? fmt::format("ep_size {} x tp_size {}", model.ep_size(), model.tp_size())
                                   : fmt::format("tp_size {}", model.tp_size()),
               options.max_num_seqs, options.max_model_len,
               engine.kv_cache_bytes() / 1048576.0, options.max_num_batched_tokens);
    std::fflush(stderr);
  }
  engine.run([] { return g_stop != 0; });
  if (server) {
    server->stop();
    fmt::print(stderr, "tp serve: stopped after {} steps\n", engine.steps());
  }
  return 0;
}

Registrar reg("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) on rank 0",
              [](CLI::App& app) {
                auto f = std::make_shared<ServeFlags>();
                add_model_flags(app, f->model);
                add_adapter_flag(app, f->adapter);
                app.add_option("--host", f->host, "address to listen on")->capture_default_str();
                app.add_option("--port", f->port, "TCP port (0: any free one, printed at start)")
                    ->capture_default_str();
                app.add_option("--api-key", f->api_key, "require \"Authorization: Bearer KEY\" on /v1/*");
                app.add_option("--served-model-name", f->served_model_name,
                               "the model name clients send (default: the model directory's name)");
                app.add_option("--max-num-seqs", f->max_num_seqs, "sequences decoded together (KV cache slots)")
                    ->capture_default_str();
                app.add_option("--max-num-batched-tokens", f->max_num_batched_tokens,
                               "tokens one step may process: one per running sequence, then chunks of prompts (a longer prompt is prefilled over several steps)")
                    ->capture_default_str();
                app.add_option("--max-model-len", f->max_model_len,
                               "prompt + max_tokens of one sequence (default: max_position_embeddings, at most 4096)");
                app.add_flag("--disable-log-requests", f->disable_log_requests,
                             "no per-request line (tokens, time to first token, tokens/s) on stderr");
                return [f] { return run_serve(*f); };
              });

}  // namespace
}  // namespace tp::cli
