#include "tp/serving/token_stream.h"

namespace tp::serving {

void TokenStream::push(int64_t token) {
  {
    std::lock_guard lock(mutex_);
    if (first_token_ == Clock::time_point{}) first_token_ = Clock::now();
    tokens_.push_back(token);
  }
  ready_.notify_all();
}

void TokenStream::finish(StreamEnd end) {
  {
    std::lock_guard lock(mutex_);
    if (end_ != StreamEnd::Running) return;
    end_ = end;
  }
  ready_.notify_all();
}

StreamEnd TokenStream::wait(std::vector<int64_t>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !tokens_.empty() || end_ != StreamEnd::Running; });
  out.insert(out.end(), tokens_.begin(), tokens_.end());
  tokens_.clear();
  return end_;
}

TokenStream::Clock::time_point TokenStream::first_token() const {
  std::lock_guard lock(mutex_);
  return first_token_;
}

}  // namespace tp::serving
