// tp generate: text (or token ids) in, generated tokens out, streamed on rank 0.
// Every rank runs the same loop; rank 0 picks each token and broadcasts it.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "tp/cli/command.h"
#include "tp/cli/common.h"
#include "tp/distributed/process_group.h"
#include "tp/generation/generate.h"
#include "tp/tokenizer/streaming_decoder.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp::cli {
namespace {

struct GenerateFlags {
  ModelFlags model;
  std::vector<std::string> prompts;
  std::vector<std::string> input_ids;
  SamplingFlags sampling;
  bool no_stream = false;
  std::string adapter;
};

int run_generate(const GenerateFlags& f) {
  if (f.prompts.empty() == f.input_ids.empty())
    throw UsageError("give either --prompt TEXT or --input-ids 1,2,3 (each may be repeated for a batch)");
  std::optional<Tokenizer> tokenizer;
  std::filesystem::path dir = f.model.model;
  if (!f.prompts.empty() || std::filesystem::exists(dir / "tokenizer.json")) {
    if (!std::filesystem::exists(dir / "tokenizer.json"))
      throw UsageError(fmt::format("--prompt needs {}; without a tokenizer use --input-ids", (dir / "tokenizer.json").string()));
    tokenizer = Tokenizer::from_model_dir(dir);
  }
  std::vector<std::vector<int64_t>> prompts;
  for (const std::string& p : f.prompts) prompts.push_back(tokenizer->encode(p));
  for (const std::string& ids : f.input_ids) prompts.push_back(parse_id_list(ids, "--input-ids"));

  PretrainedModel model = load_model(f.model, f.adapter);
  generation::GenerateOptions options;
  options.max_new_tokens = f.sampling.max_new_tokens;
  options.sampling = sampling_options(f.sampling);
  options.eos_token_ids = generation::default_eos_token_ids(model, tokenizer ? &*tokenizer : nullptr);

  const bool rank0 = dist::world().rank() == 0;  // one printer, also when several ranks are tp rank 0 (ep)
  const bool stream = rank0 && !f.model.json && !f.no_stream && prompts.size() == 1;
  std::optional<StreamingDecoder> streamer;
  if (stream && tokenizer) {
    streamer.emplace(*tokenizer, /*skip_special_tokens=*/true);  // as the --json text: no "</s>"
    std::fputs(f.prompts.empty() ? "" : f.prompts[0].c_str(), stdout);
    // The continuation decodes after the prompt: its first word keeps its space.
    if (!f.prompts.empty()) streamer->prime(prompts[0]);
  }
  auto on_token = [&](int64_t row, int64_t token) {
    if (!stream) return;
    if (streamer) {
      std::fputs(streamer->push(token).c_str(), stdout);
    } else {
      std::printf("%lld ", static_cast<long long>(token));
    }
    std::fflush(stdout);
  };
  generation::GenerateResult result = generation::generate(model, prompts, options, on_token);

  // Peak memory of every rank, gathered to all (rank 0 reports).
  Tensor rss = Tensor::from_ints({peak_rss_bytes()}, {1});
  Tensor all_rss = model.mesh().group("tp").all_gather(rss, 0);
  if (!rank0) return 0;
  if (stream) {
    if (streamer) std::fputs(streamer->flush().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
  double prefill_tps = result.prefill_seconds > 0 ? result.prefill_tokens / result.prefill_seconds : 0;
  double decode_tps = result.decode_seconds > 0 ? result.decode_tokens / result.decode_seconds : 0;
  if (f.model.json) {
    nlohmann::ordered_json j;
    j["tp_size"] = model.tp_size();
    j["token_ids"] = result.tokens.size() == 1 ? nlohmann::ordered_json(result.tokens[0]) : nlohmann::ordered_json(result.tokens);
    if (tokenizer) {
      std::vector<std::string> texts;
      for (const auto& t : result.tokens) texts.push_back(tokenizer->decode(t, true));
      j["text"] = texts.size() == 1 ? nlohmann::ordered_json(texts[0]) : nlohmann::ordered_json(texts);
    }
    j["prefill_tokens"] = result.prefill_tokens;
    j["prefill_tokens_per_s"] = prefill_tps;
    j["decode_tokens"] = result.decode_tokens;
    j["decode_tokens_per_s"] = decode_tps;
    j["peak_rss_bytes_per_rank"] = all_rss.to_int_vector();
    std::cout << j.dump() << "\n";
  } else if (!stream) {
    for (size_t i = 0; i < result.tokens.size(); ++i) {
      if (tokenizer) {
        fmt::print("[{}] {}\n", i, tokenizer->decode(result.tokens[i], true));
      } else {
        fmt::print("[{}] {}\n", i, fmt::join(result.tokens[i], ","));
      }
    }
  }
  if (!f.model.json)
    fmt::print(stderr, "prefill {:.1f} tok/s, decode {:.1f} tok/s, tp_size {}\n", prefill_tps, decode_tps,
               model.tp_size());
  return 0;
}

Registrar reg("generate", "Generate text from a prompt (greedy or sampled), streaming on rank 0", [](CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  add_model_flags(app, f->model);
  add_sequence_parallel_flag(app, f->model);
  add_adapter_flag(app, f->adapter);
  app.add_option("--prompt", f->prompts, "prompt text (repeat for a batch); needs tokenizer.json in --model");
  app.add_option("--input-ids", f->input_ids, "prompt token ids, e.g. 1,2,3 (repeat for a batch)");
  add_sampling_flags(app, f->sampling);
  app.add_flag("--no-stream", f->no_stream, "print the text at the end instead of streaming it");
  return [f] { return run_generate(*f); };
});

}  // namespace
}  // namespace tp::cli
