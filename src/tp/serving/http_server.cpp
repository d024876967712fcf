#include "tp/serving/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include "tp/serving/client_connection.h"
#include "tp/serving/completion_text.h"

namespace tp::serving {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(100);
// A stream that has had nothing to send for this long sends an SSE comment:
// writing is the only way to notice that a waiting client has gone.
constexpr auto kKeepAlive = std::chrono::seconds(1);

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void send_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_body(e)); }

// One admitted request, from its parsed body to its log line.
struct Job {
  CompletionRequest request;
  ResponseHeader header;
  GenerationRequest generation;
  std::shared_ptr<TokenStream> stream;
  std::optional<CompletionText> text;
  Usage usage;
  StreamEnd end = StreamEnd::Running;
  bool first_chunk = true, logged = false;
  Clock::time_point last_write = Clock::now();

  std::optional<FinishReason> finish_reason() const {
    if (text->stopped() || end == StreamEnd::Eos) return FinishReason::Stop;
    if (end == StreamEnd::Length) return FinishReason::Length;
    return std::nullopt;
  }
  // Waits for more tokens; returns the text they complete. Cancels the
  // sequence as soon as a stop string matched.
  std::string advance() {
    std::vector<int64_t> tokens;
    end = stream->wait(tokens, kPoll);
    std::string out = text->push(tokens);
    if (text->stopped()) {
      stream->cancel();
      end = StreamEnd::Cancelled;
    } else if (end != StreamEnd::Running) {
      out += text->finish();
    }
    usage.completion_tokens = static_cast<int64_t>(text->tokens().size());
    return out;
  }
  bool done() const { return end != StreamEnd::Running; }
};

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  Scheduler& scheduler;
  std::optional<Tokenizer> tokenizer;
  ChatRenderer chat;
  httplib::Server server;
  std::thread thread;
  int bound_port = 0;
  int64_t started = std::time(nullptr);
  std::mutex rng_mutex;
  std::mt19937_64 rng{std::random_device{}()};

  Impl(ServerOptions o, Scheduler& s, std::optional<Tokenizer> t, ChatRenderer c)
      : options(std::move(o)), scheduler(s), tokenizer(std::move(t)), chat(std::move(c)) {}

  uint64_t random64() {
    std::lock_guard lock(rng_mutex);
    return rng();
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.get_header_value("Authorization") == "Bearer " + options.api_key) return true;
    send_error(res, ApiError(401, "Incorrect API key provided: send \"Authorization: Bearer <key>\" with the key "
                                  "given to tp serve --api-key",
                             "", "invalid_request_error", "invalid_api_key"));
    return false;
  }

  // The request's prompt as token ids, and its defaults and limits applied.
  std::unique_ptr<Job> admit(const httplib::Request& req, Endpoint endpoint) {
    auto job = std::make_unique<Job>();
    job->request = parse_request(req.body, endpoint);
    CompletionRequest& r = job->request;
    if (!r.model.empty() && r.model != options.model_name)
      throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", r.model,
                                      options.model_name),
                     "model", "invalid_request_error", "model_not_found");
    std::vector<int64_t>& ids = job->generation.prompt;
    if (endpoint == Endpoint::ChatCompletions) {
      if (!chat || !tokenizer) throw ApiError(400, "this model has no chat template (tokenizer_config.json's chat_template); use /v1/completions", "messages");
      // The template writes the special tokens itself (as Transformers' apply_chat_template(tokenize=True)).
      ids = tokenizer->encode(chat(r.messages), /*add_special_tokens=*/false);
    } else if (r.prompt_is_ids) {
      ids = r.prompt_ids;
    } else {
      if (!tokenizer) throw ApiError(400, "this model has no tokenizer.json: send the prompt as a list of token ids", "prompt");
      ids = tokenizer->encode(r.prompt_text);
    }
    if (ids.empty()) throw ApiError(400, "the prompt encodes to no tokens", "prompt");
    for (int64_t id : ids)
      if (id >= options.vocab_size)
        throw ApiError(400, fmt::format("token id {} is outside the vocabulary [0, {})", id, options.vocab_size), "prompt");
    if (!r.stop.empty() && !tokenizer) throw ApiError(400, "'stop' needs a model with a tokenizer.json", "stop");

    const SchedulerOptions& limits = scheduler.options();
    const int64_t n = static_cast<int64_t>(ids.size());
    // OpenAI's default is 16 for completions; a chat may use the rest of the context.
    int64_t max_tokens = r.max_tokens.value_or(endpoint == Endpoint::Completions ? 16 : limits.max_model_len - n);
    if (n + max_tokens > limits.max_model_len || max_tokens < 1)
      throw ApiError(400, fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                      "tokens ({} in the prompt, {} in the completion). Please reduce the prompt or "
                                      "max_tokens.",
                                      limits.max_model_len, n + std::max<int64_t>(max_tokens, 0), n, max_tokens),
                     r.max_tokens ? "max_tokens" : (endpoint == Endpoint::Completions ? "prompt" : "messages"));
    job->generation.max_tokens = max_tokens;
    job->generation.sampling = {.temperature = r.temperature, .top_k = r.top_k, .top_p = r.top_p,
                                .seed = r.seed.value_or(random64())};
    job->generation.eos_token_ids = options.eos_token_ids;
    job->header = {.id = fmt::format("{}-{:016x}", endpoint == Endpoint::Completions ? "cmpl" : "chatcmpl", random64()),
                   .created = std::time(nullptr),
                   .model = options.model_name};
    job->usage.prompt_tokens = n;
    job->text.emplace(tokenizer ? &*tokenizer : nullptr, ids, r.stop);
    job->stream = scheduler.submit(job->generation);
    return job;
  }

  void log(Job& job) {
    if (!options.log_requests || job.logged) return;
    job.logged = true;
    const auto now = Clock::now(), t0 = job.stream->submitted(), t1 = job.stream->first_token();
    const bool any = t1 != Clock::time_point{};
    const double decode_s = any ? std::chrono::duration<double>(now - t1).count() : 0;
    const int64_t out = job.usage.completion_tokens;
    auto reason = job.finish_reason();
    std::fprintf(stderr,
                 "tp serve: %s %s prompt %lld tokens, completion %lld tokens (%s), time to first token %.1f ms, "
                 "%.1f tokens/s after it, total %.3f s\n",
                 job.header.id.c_str(), job.request.stream ? "stream" : "whole",
                 static_cast<long long>(job.usage.prompt_tokens), static_cast<long long>(out),
                 reason ? finish_reason_name(*reason) : "aborted", any ? ms_between(t0, t1) : 0.0,
                 decode_s > 0 && out > 1 ? (out - 1) / decode_s : 0.0, ms_between(t0, now) / 1000);
  }

  void complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    if (!authorized(req, res)) return;
    std::shared_ptr<Job> job;
    try {
      job = admit(req, endpoint);
    } catch (const ApiError& e) {
      send_error(res, e);
      return;
    } catch (const std::exception& e) {  // a tp::Error of the tokenizer or the scheduler
      send_error(res, ApiError(400, e.what()));
      return;
    }
    if (job->request.stream) {
      stream(job, res);
      return;
    }
    // A client that hangs up on a non-streaming request frees its slot at the
    // next step (a poll of its socket after every wait), not after max_tokens.
    const ClientConnection client(req.remote_addr, req.remote_port, req.local_port);
    std::string text;
    while (!job->done()) {
      text += job->advance();
      if (!job->done() && !client.connected()) {
        fail(*job);
        return;
      }
    }
    log(*job);
    if (job->end == StreamEnd::Shutdown) {
      send_error(res, ApiError(503, "the server is shutting down", "", "server_error"));
      return;
    }
    const bool ids = job->request.return_token_ids;
    send_json(res, 200,
              completion_response(endpoint, job->header, text, *job->finish_reason(), job->usage,
                                  ids ? &job->text->tokens() : nullptr)
                  .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  }

  // Server-sent events: a chunk per batch of tokens that made new text, the
  // finish chunk, the usage chunk when asked, then [DONE]. A failed write means
  // the client has gone: the sequence is cancelled and its slot freed.
  void stream(std::shared_ptr<Job> job, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& s) {
            job->last_write = Clock::now();
            return sink.write(s.data(), s.size());
          };
          const Endpoint endpoint = job->request.endpoint;
          const bool with_ids = job->request.return_token_ids;
          if (job->first_chunk && endpoint == Endpoint::ChatCompletions) {
            job->first_chunk = false;
            if (!send(stream_chunk(endpoint, job->header, "", std::nullopt, with_ids ? &kNoIds : nullptr, true)))
              return fail(*job);
          }
          const size_t before = job->text->tokens().size();
          std::string piece = job->advance();
          const std::vector<int64_t> ids(job->text->tokens().begin() + static_cast<std::ptrdiff_t>(before),
                                         job->text->tokens().end());
          if (!piece.empty() || (with_ids && !ids.empty()))
            if (!send(stream_chunk(endpoint, job->header, piece, std::nullopt, with_ids ? &ids : nullptr)))
              return fail(*job);
          if (!job->done()) {
            if (Clock::now() - job->last_write > kKeepAlive && !send(": keep-alive\n\n")) return fail(*job);
            return true;
          }
          log(*job);
          if (job->end == StreamEnd::Shutdown) {
            send("data: " + error_body(ApiError(503, "the server is shutting down", "", "server_error")) + "\n\n");
          } else {
            send(stream_chunk(endpoint, job->header, "", job->finish_reason(), with_ids ? &kNoIds : nullptr));
            if (job->request.include_usage) send(usage_chunk(endpoint, job->header, job->usage));
          }
          send(kStreamDone);
          sink.done();
          return true;
        },
        [this, job](bool success) {
          if (!success) fail(*job);
        });
  }

  bool fail(Job& job) {
    job.stream->cancel();
    log(job);
    return false;
  }

  static inline const std::vector<int64_t> kNoIds{};

  void routes() {
    server.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    server.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      send_json(res, 200, models_response(options.model_name, started, scheduler.options().max_model_len).dump());
    });
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, Endpoint::Completions);
    });
    server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, Endpoint::ChatCompletions);
    });
    // Unknown paths and methods get an OpenAI-style body too (a handler's own errors keep theirs).
    server.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string what = res.status == 404 ? "no such endpoint" : "the request failed";
      send_error(res, ApiError(res.status, fmt::format("{}: {} {}", what, req.method, req.path), "",
                               res.status == 404 ? "not_found_error" : "invalid_request_error"));
      return httplib::Server::HandlerResponse::Handled;
    }));
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, what, "", "server_error"));
    });
  }
};

HttpServer::HttpServer(ServerOptions options, Scheduler& scheduler, std::optional<Tokenizer> tokenizer,
                       ChatRenderer chat)
    : impl_(std::make_unique<Impl>(std::move(options), scheduler, std::move(tokenizer), std::move(chat))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& s = *impl_;
  const int threads = s.options.threads;
  s.server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.server.set_payload_max_length(size_t{16} << 20);
  // Each token is a small write: without this, Nagle's algorithm waits for the
  // client's delayed ACK (~40 ms) before sending the next one.
  s.server.set_tcp_nodelay(true);
  s.routes();
  if (s.options.port == 0) {
    s.bound_port = s.server.bind_to_any_port(s.options.host);
    TP_CHECK(s.bound_port > 0, "tp serve: cannot listen on {} (any port)", s.options.host);
  } else {
    TP_CHECK(s.server.bind_to_port(s.options.host, s.options.port),
             "tp serve: cannot listen on {}:{} (in use, or not an address of this machine?)", s.options.host,
             s.options.port);
    s.bound_port = s.options.port;
  }
  s.thread = std::thread([&s] { s.server.listen_after_bind(); });
}

void HttpServer::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

int HttpServer::port() const { return impl_->bound_port; }

}  // namespace tp::serving
