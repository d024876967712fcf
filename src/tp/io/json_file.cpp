#include "tp/io/json_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tp/core/error.h"

namespace tp::io {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  TP_CHECK(in, "cannot open {}: {}", file.string(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", file.string(), e.what());
  }
}

std::string dump_json(const nlohmann::json& j) { return j.dump(2) + "\n"; }

void write_text_file(const fs::path& file, const std::string& text) {
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TP_CHECK(out, "cannot create {}: {}", tmp.string(), std::strerror(errno));
    out << text;
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      fail("writing {} failed", tmp.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  TP_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), file.string(), ec.message());
}

}  // namespace tp::io
