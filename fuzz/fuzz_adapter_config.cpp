// libFuzzer target for PEFT's adapter_config.json as LoraConfig reads it: any
// text ends in a config or a tp::Error, never a crash or another exception; an
// accepted config written back (to_json) reads back to itself.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "tp/core/error.h"
#include "tp/training/lora_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON: load_adapter's read_json_file reports that, naming the file
  }
  tp::training::LoraConfig c;
  try {
    c = tp::training::LoraConfig::from_json(j, "fuzz/adapter_config.json");
  } catch (const tp::Error&) {
    return 0;
  }
  const nlohmann::json written = c.to_json();
  try {
    if (tp::training::LoraConfig::from_json(written, "written").to_json() != written) std::abort();
  } catch (const tp::Error&) {
    std::abort();
  }
  return 0;
}
