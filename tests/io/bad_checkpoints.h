#pragma once
// Hand-made broken model directories, one per way a checkpoint can be bad. Used
// by the unit tests (Checkpoint::open must throw) and by the CLI test (tp inspect
// must exit 1 with the message).
#include <filesystem>
#include <string>
#include <vector>

namespace tp::io::testing {

struct BadCase {
  std::string name;
  std::filesystem::path dir;       // the model directory to open
  std::filesystem::path bad_file;  // the file the error must name
  std::string expected;            // a substring of the error message
  std::string tensor;              // the tensor the error must name ("" when none)
  bool needs_verify = false;       // only `tp inspect --verify` (reading data) finds it
};

// Writes every case under `root` (wiped first).
std::vector<BadCase> make_bad_checkpoints(const std::filesystem::path& root);

// A complete valid llama checkpoint of `layers` layers with tiny sizes.
void write_valid_checkpoint(const std::filesystem::path& dir, int layers = 1);

// A safetensors file from raw pieces: 8-byte length (`declared_len` when >= 0,
// else the header's size), the header text, then `data_bytes` zero bytes.
void write_raw_safetensors(const std::filesystem::path& file, const std::string& header, size_t data_bytes,
                           long long declared_len = -1);

}  // namespace tp::io::testing
