#pragma once
// One request as the batch engine sees it (token ids in, token ids out), and
// the channel its tokens travel through from the model loop to the HTTP thread
// that waits for them. Text, stop strings and JSON stay on the HTTP side.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "tp/generation/sampling.h"

namespace tp::serving {

struct GenerationRequest {
  std::vector<int64_t> prompt;
  int64_t max_tokens = 16;
  // stream and step of ops::sample_tokens are 0 and the token's index in the request, so
  // a seeded request picks what `tp generate --seed` picks for that prompt alone.
  generation::SamplingOptions sampling;
  std::vector<int64_t> eos_token_ids;  // the stream ends after one of these
};

// Why a stream ended: an end-of-sequence id, max_tokens, the client went away
// (or a stop string matched: the reader cancels), or the server shut down.
enum class StreamEnd { Running, Eos, Length, Cancelled, Shutdown };

class TokenStream {
 public:
  using Clock = std::chrono::steady_clock;

  // Model loop (rank 0).
  void push(int64_t token);
  void finish(StreamEnd end);  // the first call wins

  // Reader: moves the tokens that arrived since the last call into `out`,
  // waiting up to `timeout` when there are none yet. Returns the end, or
  // Running while tokens may still come.
  StreamEnd wait(std::vector<int64_t>& out, std::chrono::milliseconds timeout);
  // Reader: no more tokens are wanted; the engine frees the sequence's slot at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // For the request log: when it was submitted and when its first token came.
  Clock::time_point submitted() const { return submitted_; }
  Clock::time_point first_token() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<int64_t> tokens_;
  StreamEnd end_ = StreamEnd::Running;
  std::atomic<bool> cancelled_{false};
  Clock::time_point submitted_ = Clock::now(), first_token_{};
};

}  // namespace tp::serving
