#include "tp/models/quantization_config.h"

#include <algorithm>
#include <cctype>
#include <memory>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tp/core/error.h"

namespace tp {

namespace {

using nlohmann::json;

// A pattern longer than this is no module name: refusing it bounds std::regex's recursion.
constexpr size_t kMaxPatternLength = 512;

// One object's keys, with errors naming the file, the object and the key.
struct Keys {
  const json& j;
  std::string where;  // "config.json: quantization_config" or "...: config_groups.group_0.weights"

  const json* get(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* key, const json& v, const std::string& accepted) const {
    fail("{}: '{}' is {}; {}", where, key, v.dump(), accepted);
  }
  int64_t integer(const char* key, const json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))
      return static_cast<int64_t>(v.get<double>());
    bad(key, v, "it must be an integer");
  }
  std::optional<int64_t> opt_int(const char* key) const {
    const json* v = get(key);
    return v ? std::optional<int64_t>(integer(key, *v)) : std::nullopt;
  }
  // `key` or its alias (AWQ's w_bit / q_group_size); both present must agree.
  std::optional<int64_t> int_or_alias(const char* key, const char* alias) const {
    const std::optional<int64_t> a = opt_int(key), b = opt_int(alias);
    TP_CHECK(!a || !b || *a == *b, "{}: '{}' is {} but '{}' is {}; they name the same setting and must agree", where,
             key, *a, alias, *b);
    return a ? a : b;
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) bad(key, *v, "it must be true or false");
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) bad(key, *v, "it must be a string");
    return v->get<std::string>();
  }
  std::vector<std::string> names(const char* key) const {
    std::vector<std::string> out;
    const json* v = get(key);
    if (!v) return out;
    if (!v->is_array()) bad(key, *v, "it must be a list of module names or patterns");
    for (const json& s : *v) {
      if (!s.is_string()) bad(key, *v, "it must be a list of module names or patterns");
      TP_CHECK(!s.get<std::string>().empty(), "{}: '{}' has an empty entry (it would name every module)", where, key);
      TP_CHECK(s.get<std::string>().size() <= kMaxPatternLength, "{}: an entry of '{}' is {} characters long; module "
               "names and patterns of up to {} are accepted", where, key, s.get<std::string>().size(),
               kMaxPatternLength);
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  bool non_empty(const char* key) const {
    const json* v = get(key);
    return v && !(v->is_object() && v->empty()) && !(v->is_array() && v->empty()) && !(v->is_boolean() && !*v);
  }
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

void check_bits(const Keys& k, const char* key, int64_t bits, const std::string& method, bool four_only) {
  const bool ok = bits == 4 || (!four_only && bits == 8);
  TP_CHECK(ok, "{}: '{}' is {}: {} checkpoints with {}-bit weights are not supported; supported: {}", k.where, key,
           bits, method, bits, four_only ? "4 (AWQ GEMM packs 4-bit values)" : "4, 8");
}

void check_group_size(const Keys& k, const char* key, int64_t g, int bits) {
  const int64_t pack = 32 / bits;
  TP_CHECK(g == -1 || (g > 0 && g % pack == 0 && g <= (int64_t{1} << 31)),
           "{}: '{}' is {}; accepted: -1 (one group spanning all input features) or a positive multiple of {} (the "
           "values one int32 word packs at {} bits), e.g. 32, 64, 128",
           k.where, key, g, pack, bits);
}

QuantizationConfig parse_gptq(const Keys& k) {
  QuantizationConfig q;
  q.method = "gptq";
  const std::optional<int64_t> bits = k.opt_int("bits");
  TP_CHECK(bits, "{}: required key 'bits' is missing (4 or 8)", k.where);
  check_bits(k, "bits", *bits, "GPTQ", false);
  q.bits = static_cast<int>(*bits);
  q.group_size = k.opt_int("group_size").value_or(128);
  check_group_size(k, "group_size", q.group_size, q.bits);
  q.desc_act = k.boolean("desc_act", false);
  q.sym = k.boolean("sym", true);
  // GPTQModel writes checkpoint_format; older files "format". Both present must agree.
  const std::string cf = k.string("checkpoint_format", ""), f = k.string("format", "");
  TP_CHECK(cf.empty() || f.empty() || cf == f,
           "{}: 'checkpoint_format' is \"{}\" but 'format' is \"{}\"; they name the same setting and must agree",
           k.where, cf, f);
  q.checkpoint_format = !cf.empty() ? cf : !f.empty() ? f : "gptq";
  TP_CHECK(q.checkpoint_format == "gptq" || q.checkpoint_format == "gptq_v2",
           "{}: 'checkpoint_format' is \"{}\"; supported: \"gptq\" (v1, zero points stored minus one) and "
           "\"gptq_v2\" (kernel-specific layouts such as marlin or bitblas are not read)",
           k.where, q.checkpoint_format);
  q.lm_head = k.boolean("lm_head", false);
  TP_CHECK(!k.non_empty("dynamic"),
           "{}: 'dynamic' holds per-module overrides ({}); tp reads one setting for every module", k.where,
           k.get("dynamic") ? k.get("dynamic")->dump() : "");
  q.not_converted = k.names("modules_to_not_convert");
  return q;
}

QuantizationConfig parse_awq(const Keys& k) {
  QuantizationConfig q;
  q.method = "awq";
  const std::optional<int64_t> bits = k.int_or_alias("bits", "w_bit");
  TP_CHECK(bits, "{}: required key 'bits' (or 'w_bit') is missing (4)", k.where);
  check_bits(k, k.get("bits") ? "bits" : "w_bit", *bits, "AWQ", true);
  q.bits = 4;
  const std::optional<int64_t> g = k.int_or_alias("group_size", "q_group_size");
  TP_CHECK(g, "{}: required key 'group_size' (or 'q_group_size') is missing (e.g. 128)", k.where);
  check_group_size(k, k.get("group_size") ? "group_size" : "q_group_size", *g, 4);
  q.group_size = *g;
  // WQLinear_GEMM always carries qzeros: AutoAWQ's GEMM packing needs the zero points.
  TP_CHECK(k.boolean("zero_point", true),
           "{}: 'zero_point' is false; AWQ GEMM checkpoints carry zero points (qzeros), tp reads those only", k.where);
  q.sym = false;
  const std::string version = k.string("version", "gemm");
  TP_CHECK(lower(version) == "gemm",
           "{}: 'version' is \"{}\"; supported: \"gemm\" (GEMV, exllama, ipex and marlin layouts are not read)",
           k.where, version);
  q.not_converted = k.names("modules_to_not_convert");
  return q;
}

// The one weights scheme of config_groups (several groups must agree: tp applies one scheme to every Linear).
const json& ct_weights(const Keys& k) {
  const json* groups = k.get("config_groups");
  TP_CHECK(groups && groups->is_object() && !groups->empty(),
           "{}: 'config_groups' must be an object of quantization schemes (e.g. {{\"group_0\": {{\"targets\": "
           "[\"Linear\"], \"weights\": {{...}}}}}}), got {}",
           k.where, groups ? groups->dump() : "nothing");
  const json* first = nullptr;
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const Keys g{it.value(), fmt::format("{}.config_groups.{}", k.where, it.key())};
    TP_CHECK(g.j.is_object(), "{}: must be an object, got {}", g.where, g.j.dump());
    const json* targets = g.get("targets");
    TP_CHECK(targets && *targets == json::array({"Linear"}),
             "{}: 'targets' is {}; supported: [\"Linear\"] (every Linear, less 'ignore')", g.where,
             targets ? targets->dump() : "missing");
    TP_CHECK(!g.get("input_activations") && !g.get("output_activations"),
             "{}: activations are quantized ({}); supported: weight-only schemes (W4A16, W8A16)", g.where,
             g.get("input_activations") ? g.get("input_activations")->dump() : g.get("output_activations")->dump());
    const std::string format = g.string("format", "pack-quantized");
    TP_CHECK(format == "pack-quantized", "{}: 'format' is \"{}\"; supported: \"pack-quantized\"", g.where, format);
    const json* w = g.get("weights");
    TP_CHECK(w && w->is_object(), "{}: 'weights' must be an object (num_bits, type, symmetric, strategy), got {}",
             g.where, w ? w->dump() : "nothing");
    TP_CHECK(!first || *first == *w, "{}: 'weights' is {}, unlike an earlier group's {}; tp applies one scheme to "
             "every Linear", g.where, w->dump(), first->dump());
    first = w;
  }
  return *first;
}

QuantizationConfig parse_compressed_tensors(const Keys& k) {
  QuantizationConfig q;
  q.method = "compressed-tensors";
  const std::string format = k.string("format", "");
  TP_CHECK(format == "pack-quantized",
           "{}: 'format' is \"{}\"; supported: \"pack-quantized\" (int4/int8 weight-only, W4A16/W8A16); "
           "float-quantized (FP8), int-quantized (W8A8), naive-quantized and sparse formats are not read",
           k.where, format.empty() ? "missing" : format);
  const std::string status = k.string("quantization_status", "compressed");
  TP_CHECK(status == "compressed", "{}: 'quantization_status' is \"{}\"; the weights must be saved \"compressed\" "
           "(packed)", k.where, status);
  TP_CHECK(!k.non_empty("kv_cache_scheme"), "{}: 'kv_cache_scheme' is {}; quantized KV caches are not supported",
           k.where, k.get("kv_cache_scheme") ? k.get("kv_cache_scheme")->dump() : "");
  if (const json* sp = k.get("sparsity_config"); sp && sp->is_object() && !sp->empty())
    TP_CHECK(sp->value("format", "dense") == "dense", "{}: 'sparsity_config' is {}; sparse weights are not supported",
             k.where, sp->dump());
  const Keys w{ct_weights(k), k.where + ".config_groups.*.weights"};
  const std::optional<int64_t> bits = w.opt_int("num_bits");
  TP_CHECK(bits, "{}: required key 'num_bits' is missing (4 or 8)", w.where);
  check_bits(w, "num_bits", *bits, "compressed-tensors", false);
  q.bits = static_cast<int>(*bits);
  const std::string type = w.string("type", "int");
  TP_CHECK(type == "int", "{}: 'type' is \"{}\"; supported: \"int\" (float weights are FP8's float-quantized format)",
           w.where, type);
  TP_CHECK(w.get("symmetric"), "{}: required key 'symmetric' is missing (true or false)", w.where);
  q.sym = w.boolean("symmetric", true);
  TP_CHECK(!w.boolean("dynamic", false), "{}: 'dynamic' is true; weights must have static scales", w.where);
  const std::string strategy = w.string("strategy", "");
  const std::optional<int64_t> g = w.opt_int("group_size");
  if (strategy == "group") {
    TP_CHECK(g, "{}: strategy \"group\" needs 'group_size'", w.where);
    check_group_size(w, "group_size", *g, q.bits);
    TP_CHECK(*g > 0, "{}: strategy \"group\" needs a positive 'group_size', got {} (strategy \"channel\" is one "
             "scale per output row)", w.where, *g);
    q.group_size = *g;
  } else if (strategy == "channel") {
    TP_CHECK(!g || *g == -1, "{}: strategy \"channel\" with 'group_size' {}: contradictory (a channel scale spans "
             "every input); use strategy \"group\"", w.where, *g);
    q.group_size = -1;
  } else {
    fail("{}: 'strategy' is \"{}\"; supported: \"group\" and \"channel\" (tensor, tensor_group, block and token "
         "scales are not read)", w.where, strategy.empty() ? "missing" : strategy);
  }
  if (const json* a = w.get("actorder"); a && !(a->is_boolean() && !a->get<bool>()))
    TP_CHECK(*a == "weight", "{}: 'actorder' is {}; supported: null and \"weight\" (\"group\" stores weight_g_idx, "
             "which tp does not read)", w.where, a->dump());
  q.not_converted = k.names("ignore");
  return q;
}

QuantizationConfig parse_mxfp4(const Keys& k) {
  QuantizationConfig q;
  q.method = "mxfp4";
  q.group_size = 32;
  q.not_converted = k.names("modules_to_not_convert");
  return q;
}

// Backtracking steps one pattern may take on one module name. Module-name patterns ("re:.*lm_head",
// "model.layers.0.mlp") take a few hundred; a nested quantifier such as "(.*)*x" takes exponentially many, and
// would hang the loader (std::regex did, in the fuzzer) where PCRE2 stops and says so.
constexpr uint32_t kMatchLimit = 100000;

// A regex from the start of `name`, ending at its end or at a '.' (so "model.layers.1" is not
// "model.layers.10"). A pattern that does not compile matches as plain text (Python's re would refuse it,
// but a module name with a '[' or '*' is still a module name).
bool matches_from_start(const std::string& pattern, const std::string& name, bool to_end) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  const std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_ANCHORED, &err, &offset,
                    nullptr),
      pcre2_code_free);
  if (!code) return name == pattern || name.starts_with(pattern + ".");
  const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code.get(), nullptr), pcre2_match_data_free);
  const std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> ctx(
      pcre2_match_context_create(nullptr), pcre2_match_context_free);
  pcre2_set_match_limit(ctx.get(), kMatchLimit);
  pcre2_set_depth_limit(ctx.get(), kMatchLimit);
  const int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0, md.get(),
                             ctx.get());
  TP_CHECK(rc != PCRE2_ERROR_MATCHLIMIT && rc != PCRE2_ERROR_DEPTHLIMIT,
           "quantization_config: the module pattern /{}/ takes more than {} backtracking steps on '{}' (a nested "
           "quantifier such as '(.*)*'?); patterns like 're:.*lm_head' or 'model.layers.0.mlp' are accepted",
           pattern, kMatchLimit, name);
  if (rc < 0) return false;
  const size_t end = pcre2_get_ovector_pointer(md.get())[1];
  return to_end ? end == name.size() : end == name.size() || name[end] == '.' || pattern.back() == '.';
}

bool names_module(const std::string& method, const std::string& entry, const std::string& name) {
  if (method == "awq") return name.find(entry) != std::string::npos;
  if (method == "compressed-tensors")
    return entry.starts_with("re:") ? matches_from_start(entry.substr(3), name, false) : entry == name;
  return matches_from_start(entry, name, false) || name.ends_with(entry);
}

}  // namespace

bool QuantizationConfig::quantizes(const std::string& linear_module_name) const {
  if (linear_module_name.size() > kMaxPatternLength * 4) return true;  // no module has such a name
  if (linear_module_name == "lm_head" && method != "compressed-tensors") return lm_head;
  return std::none_of(not_converted.begin(), not_converted.end(),
                      [&](const std::string& e) { return names_module(method, e, linear_module_name); });
}

std::optional<QuantizationConfig> parse_quantization_config(const json& config, const std::string& source) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const Keys k{*it, source + ": quantization_config"};
  TP_CHECK(it->is_object(), "{}: must be an object (with quant_method) or null, got {}", k.where, it->dump());
  const std::string method = k.string("quant_method", "");
  TP_CHECK(!method.empty(), "{}: required key 'quant_method' is missing (\"gptq\", \"awq\", \"compressed-tensors\")",
           k.where);
  if (method == "gptq") return parse_gptq(k);
  if (method == "awq") return parse_awq(k);
  if (method == "compressed-tensors") return parse_compressed_tensors(k);
  if (method == "mxfp4") return parse_mxfp4(k);
  fail("{}: 'quant_method' is \"{}\"; supported: \"gptq\", \"awq\", \"compressed-tensors\" (pack-quantized), "
       "\"mxfp4\" (GPT-OSS experts)", k.where, method);
}

}  // namespace tp
