#pragma once
// Training text as fixed-length token blocks, the way Transformers' run_clm
// prepares it: every document tokenized with the model's tokenizer (its BOS
// when the tokenizer adds one), an EOS after each, all concatenated and cut
// into blocks of seq_len tokens (group_texts; the remainder is dropped). Labels
// are the block itself: the loss shifts them.
//
// Files: *.jsonl / *.json are JSON lines, one {"text": ...} object per line;
// anything else is plain text, split into documents as the `datasets` text
// loader's sample_by says: "line" (default; empty lines skipped), "paragraph"
// (separated by blank lines) or "document" (the whole file).
//
// Order: epoch e visits the blocks in a permutation drawn from (seed, e) by a
// Fisher-Yates shuffle over splitmix64, the same on every rank and machine.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tp/tensor/tensor.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp::training {

struct TextDataOptions {
  int64_t seq_len = 1024;
  std::string sample_by = "line";  // plain text files: line | paragraph | document
};

class TokenBlocks {
 public:
  // Errors name the file (and line for JSON) for what is unreadable, empty, or
  // shorter than one block.
  static TokenBlocks from_files(const std::vector<std::filesystem::path>& files, const Tokenizer& tokenizer,
                                const TextDataOptions& options);
  // Blocks of a given token stream (tests, benchmarks).
  static TokenBlocks from_tokens(std::vector<int32_t> tokens, int64_t seq_len, std::string source = "tokens");

  int64_t size() const { return static_cast<int64_t>(tokens_.size()) / seq_len_; }  // blocks
  int64_t seq_len() const { return seq_len_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }  // in blocks
  int64_t documents() const { return documents_; }
  int64_t dropped_tokens() const { return dropped_; }  // the remainder past the last whole block
  const std::string& source() const { return source_; }
  // A hash of every token: ranks compare it to be sure they train on the same data,
  // and a resume compares it with the checkpoint's.
  uint64_t fingerprint() const;

  // Blocks `indices` as input ids [n, seq_len] i64 (labels are the same tensor).
  Tensor batch(const std::vector<int64_t>& indices) const;

 private:
  std::vector<int32_t> tokens_;
  int64_t seq_len_ = 0, documents_ = 0, dropped_ = 0;
  std::string source_;
};

// The order of `n` blocks in epoch `epoch` (a permutation; identity when !shuffle).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle = true);

}  // namespace tp::training
