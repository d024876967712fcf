// quantization_config as the formats' tools write it (accepted, with the values read) and as tp cannot read
// it (each an error naming the key, the value and what is accepted); which modules each format's
// modules_to_not_convert / ignore matching leaves unquantized; the packed shapes each format implies.
#include <gtest/gtest.h>

#include <chrono>

#include "ops/op_test_util.h"
#include "tp/models/config.h"
#include "tp/models/quantized_shapes.h"

using namespace tp;
using nlohmann::json;
using tp::test::expect_error;

namespace {

QuantizationConfig parse(const json& q) {
  const std::optional<QuantizationConfig> c = parse_quantization_config({{"quantization_config", q}}, "m/config.json");
  if (!c) throw Error("no quantization_config");
  return *c;
}

json ct(const json& weights, const json& extra = json::object()) {
  json q = {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
            {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}}}}}, {"ignore", {"lm_head"}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) q[it.key()] = it.value();
  return q;
}

json with(json base, const char* key, json value) {
  base[key] = std::move(value);
  return base;
}

const json kW4g128 = {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 128}};

}  // namespace

TEST(QuantizationConfig, AcceptsWhatTheFormatsWrite) {
  QuantizationConfig g = parse({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1}, {"desc_act", true},
                                {"sym", false}, {"checkpoint_format", "gptq_v2"}, {"modules_to_not_convert", nullptr}});
  EXPECT_EQ(g.bits, 8);
  EXPECT_EQ(g.group_size, -1);
  EXPECT_TRUE(g.desc_act);
  EXPECT_FALSE(g.sym);
  EXPECT_FALSE(g.zeros_minus_one());
  EXPECT_TRUE(parse({{"quant_method", "gptq"}, {"bits", 4}}).zeros_minus_one());  // v1 by default
  QuantizationConfig a = parse({{"quant_method", "awq"}, {"w_bit", 4}, {"q_group_size", 64}, {"zero_point", true},
                                {"version", "GEMM"}});
  EXPECT_EQ(a.group_size, 64);
  EXPECT_FALSE(a.sym);
  QuantizationConfig c = parse(ct({{"num_bits", 8}, {"type", "int"}, {"symmetric", false}, {"strategy", "channel"},
                                   {"group_size", nullptr}, {"actorder", nullptr}}));
  EXPECT_EQ(c.bits, 8);
  EXPECT_EQ(c.group_size, -1);
  EXPECT_FALSE(c.sym);
  EXPECT_EQ(c.not_converted, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(parse({{"quant_method", "mxfp4"}, {"modules_to_not_convert", {"lm_head"}}}).method, "mxfp4");
  EXPECT_FALSE(parse_quantization_config({{"quantization_config", nullptr}}, "c"));
}

TEST(QuantizationConfig, RefusesWhatItCannotReadByName) {
  const json gptq = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
  expect_error([&] { parse(with(gptq, "bits", 3)); }, {"m/config.json: quantization_config", "'bits' is 3", "supported: 4, 8"});
  expect_error([&] { parse(with(gptq, "bits", 2)); }, {"'bits' is 2"});
  expect_error([&] { parse(json{{"quant_method", "gptq"}}); }, {"required key 'bits' is missing"});
  expect_error([&] { parse(with(gptq, "group_size", 0)); }, {"'group_size' is 0", "-1", "multiple of 8"});
  expect_error([&] { parse(with(gptq, "group_size", 100)); }, {"'group_size' is 100"});
  expect_error([&] { parse(with(gptq, "checkpoint_format", "marlin")); }, {"'checkpoint_format' is \"marlin\"", "gptq_v2"});
  expect_error([&] { parse(with(with(gptq, "checkpoint_format", "gptq"), "format", "gptq_v2")); }, {"must agree"});
  expect_error([&] { parse(with(gptq, "desc_act", "yes")); }, {"'desc_act' is \"yes\"", "true or false"});
  expect_error([&] { parse(with(gptq, "lm_head", "yes")); }, {"'lm_head' is \"yes\"", "true or false"});
  expect_error([&] { parse(with(gptq, "modules_to_not_convert", "lm_head")); }, {"'modules_to_not_convert'", "a list"});
  expect_error([&] { parse(with(gptq, "quant_method", "bitsandbytes")); },
               {"'quant_method' is \"bitsandbytes\"", "\"gptq\", \"awq\", \"compressed-tensors\""});
  expect_error([] { parse(json{{"bits", 4}}); }, {"required key 'quant_method' is missing"});
  expect_error([] { parse(json::array()); }, {"must be an object"});

  const json awq = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}};
  expect_error([&] { parse(with(awq, "w_bit", 8)); }, {"'bits' is 4 but 'w_bit' is 8", "must agree"});
  expect_error([&] { parse(with(awq, "bits", 8)); }, {"'bits' is 8", "AWQ GEMM packs 4-bit"});
  expect_error([&] { parse(with(awq, "version", "gemv")); }, {"'version' is \"gemv\"", "\"gemm\""});
  expect_error([&] { parse(with(awq, "zero_point", false)); }, {"'zero_point' is false"});
  expect_error([] { parse(json{{"quant_method", "awq"}, {"bits", 4}}); }, {"'group_size' (or 'q_group_size') is missing"});

  expect_error([&] { parse(ct(kW4g128, {{"format", "float-quantized"}})); },
               {"'format' is \"float-quantized\"", "supported: \"pack-quantized\"", "FP8"});
  expect_error([&] { parse(ct(with(kW4g128, "strategy", "tensor"))); },
               {"'strategy' is \"tensor\"", "\"group\" and \"channel\""});
  expect_error([&] { parse(ct(with(kW4g128, "num_bits", 3))); }, {"'num_bits' is 3"});
  expect_error([&] { parse(ct(with(kW4g128, "type", "float"))); }, {"'type' is \"float\""});
  expect_error([&] { parse(ct(with(kW4g128, "group_size", nullptr))); }, {"strategy \"group\" needs 'group_size'"});
  expect_error([&] { parse(ct(with(with(kW4g128, "strategy", "channel"), "group_size", 128))); },
               {"strategy \"channel\" with 'group_size' 128", "contradictory"});
  expect_error([&] { parse(ct(with(kW4g128, "actorder", "group"))); }, {"'actorder' is \"group\""});
  json w8a8 = ct(kW4g128);
  w8a8["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  expect_error([&] { parse(w8a8); }, {"activations are quantized", "W4A16"});
  json two = ct(kW4g128);
  two["config_groups"]["group_1"] = {{"targets", {"Linear"}}, {"weights", with(kW4g128, "num_bits", 8)}};
  expect_error([&] { parse(two); }, {"config_groups.group_1", "one scheme"});
}

TEST(QuantizationConfig, EachFormatMatchesNotConvertedItsOwnWay) {
  QuantizationConfig g = parse({{"quant_method", "gptq"}, {"bits", 4},
                                {"modules_to_not_convert", {"model.layers.1", "model.layers.*.mlp.gate", "o_proj"}}});
  EXPECT_FALSE(g.quantizes("model.layers.1.self_attn.q_proj"));  // a prefix up to a '.'
  EXPECT_TRUE(g.quantizes("model.layers.10.self_attn.q_proj"));
  EXPECT_FALSE(g.quantizes("model.layers.3.mlp.gate"));          // a regex
  EXPECT_TRUE(g.quantizes("model.layers.3.mlp.gate_proj"));
  EXPECT_FALSE(g.quantizes("model.layers.3.self_attn.o_proj"));  // a suffix
  QuantizationConfig a = parse({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128},
                                {"modules_to_not_convert", {"mlp.gate"}}});
  EXPECT_FALSE(a.quantizes("model.layers.0.mlp.gate_proj"));  // AutoAWQ's substring rule
  EXPECT_TRUE(a.quantizes("model.layers.0.mlp.up_proj"));
  json ignore = ct(kW4g128);
  ignore["ignore"] = {"lm_head", "re:.*mlp\\.gate$", "model.layers.0.self_attn.q_proj"};
  QuantizationConfig c = parse(ignore);
  EXPECT_FALSE(c.quantizes("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(c.quantizes("model.layers.1.self_attn.q_proj"));  // exact names only
  EXPECT_FALSE(c.quantizes("model.layers.5.mlp.gate"));
  EXPECT_TRUE(c.quantizes("model.layers.5.mlp.gate_proj"));
}

// lm_head is quantized where GPTQ's `lm_head` says so (GPTQModel), never in AWQ, and in compressed-tensors
// unless `ignore` names it, whatever modules_to_not_convert leaves out.
TEST(QuantizationConfig, LmHeadIsQuantizedWhereTheFormatSaysSo) {
  const json gptq = {{"quant_method", "gptq"}, {"bits", 4}};
  EXPECT_FALSE(parse(gptq).quantizes("lm_head"));
  EXPECT_TRUE(parse(with(gptq, "lm_head", true)).quantizes("lm_head"));
  EXPECT_FALSE(parse(with(gptq, "lm_head", false)).quantizes("lm_head"));
  EXPECT_FALSE(parse({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}}).quantizes("lm_head"));
  EXPECT_FALSE(parse(ct(kW4g128)).quantizes("lm_head"));  // ignore: ["lm_head"]
  EXPECT_TRUE(parse(ct(kW4g128, {{"ignore", json::array()}})).quantizes("lm_head"));
}

// A pattern whose backtracking grows exponentially with the name (std::regex hung the fuzzer on one) is
// refused by name in bounded time; one that does not compile matches as plain text.
TEST(QuantizationConfig, PatternsThatBacktrackWithoutBoundAreRefused) {
  QuantizationConfig g = parse({{"quant_method", "gptq"}, {"bits", 4}, {"modules_to_not_convert", {"(a|aa)*(a|aa)*c"}}});
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { g.quantizes(std::string(40, 'a') + "b.c"); }, {"/(a|aa)*(a|aa)*c/", "backtracking"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  QuantizationConfig bad = parse({{"quant_method", "gptq"}, {"bits", 4},
                                  {"modules_to_not_convert", {"model.layers.**mlp", "model[0"}}});
  EXPECT_TRUE(bad.quantizes("model.layers.0.mlp.up_proj"));
  EXPECT_FALSE(bad.quantizes("model[0.mlp.up_proj"));  // the plain-text prefix
}

TEST(QuantizationConfig, PackedShapesPerFormat) {
  auto shapes = [](const QuantizationConfig& q) {
    std::vector<std::pair<std::string, Shape>> out;
    for (const PackedTensorSpec& s : packed_tensor_specs(q, "L", {512, 256})) out.emplace_back(s.name, s.shape);
    return out;
  };
  using V = std::vector<std::pair<std::string, Shape>>;
  EXPECT_EQ(shapes(parse({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}})),
            (V{{"L.qweight", {32, 512}}, {"L.qzeros", {2, 64}}, {"L.scales", {2, 512}}, {"L.g_idx", {256}}}));
  EXPECT_EQ(shapes(parse({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1}})),
            (V{{"L.qweight", {64, 512}}, {"L.qzeros", {1, 128}}, {"L.scales", {1, 512}}, {"L.g_idx", {256}}}));
  EXPECT_EQ(shapes(parse({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}})),
            (V{{"L.qweight", {256, 64}}, {"L.qzeros", {8, 64}}, {"L.scales", {8, 512}}}));
  EXPECT_EQ(shapes(parse(ct(with(kW4g128, "symmetric", false)))),
            (V{{"L.weight_packed", {512, 32}}, {"L.weight_scale", {512, 2}}, {"L.weight_shape", {2}},
               {"L.weight_zero_point", {64, 2}}}));
  expect_error([] { packed_tensor_specs(parse({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}}), "L", {12, 256}); },
               {"'L': out_features", "is 12, not a multiple of 8"});
}
