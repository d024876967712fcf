// DistributedConfig, ParallelismConfig, loading a model, its forward and
// generate, plan reports. The GIL is released while a model computes.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <chrono>

#include "bindings.h"
#include "tp/distributed/parallelism_config.h"
#include "tp/generation/generate.h"
#include "tp/models/auto.h"
#include "tp/models/checkpoint.h"
#include "tp/models/plan_report.h"
#include "tp/models/save_pretrained.h"

namespace tp::python {

namespace {

py::dict plan_dict(const parallel::Plan& plan) {
  py::dict d;  // Python dicts keep insertion order: the plan's order
  for (const auto& [key, style] : plan) d[py::str(key)] = style;
  return d;
}

// Ids in, logits out; ids may be [T] or [B, T].
py::array model_forward(PretrainedModel& model, const py::handle& ids) {
  Tensor input = ids_from_python(ids, model.config().vocab_size, "input_ids");
  Tensor logits;
  {
    py::gil_scoped_release release;
    logits = model.forward(input);
  }
  return to_numpy(logits);
}

}  // namespace

void bind_models(py::module_& m) {
  py::class_<DistributedConfig>(m, "DistributedConfig")
      .def(py::init([](std::optional<int64_t> tp_size, std::string tp_plan, bool enable_sequence_parallel,
                       std::optional<int64_t> ep_size, std::string ep_plan) {
             return DistributedConfig{.tp_size = tp_size,
                                      .tp_plan = std::move(tp_plan),
                                      .enable_sequence_parallel = enable_sequence_parallel,
                                      .ep_size = ep_size,
                                      .ep_plan = std::move(ep_plan)};
           }),
           py::arg("tp_size") = py::none(), py::arg("tp_plan") = "auto", py::arg("enable_sequence_parallel") = false,
           py::arg("ep_size") = py::none(), py::arg("ep_plan") = "auto")
      .def_readwrite("tp_size", &DistributedConfig::tp_size)
      .def_readwrite("tp_plan", &DistributedConfig::tp_plan)
      .def_readwrite("enable_sequence_parallel", &DistributedConfig::enable_sequence_parallel)
      .def_readwrite("ep_size", &DistributedConfig::ep_size)
      .def_readwrite("ep_plan", &DistributedConfig::ep_plan);

  py::class_<dist::ParallelismConfig>(m, "ParallelismConfig")
      .def(py::init([](std::optional<int64_t> dp_replicate_size, std::optional<int64_t> dp_shard_size,
                       std::optional<int64_t> tp_size) {
             return dist::ParallelismConfig{dp_replicate_size, dp_shard_size, tp_size};
           }),
           py::arg("dp_replicate_size") = py::none(), py::arg("dp_shard_size") = py::none(),
           py::arg("tp_size") = py::none())
      .def_readwrite("dp_replicate_size", &dist::ParallelismConfig::dp_replicate_size)
      .def_readwrite("dp_shard_size", &dist::ParallelismConfig::dp_shard_size)
      .def_readwrite("tp_size", &dist::ParallelismConfig::tp_size)
      .def("__repr__", &dist::ParallelismConfig::to_string);

  py::class_<PretrainedModel>(m, "PretrainedModel")
      .def_property_readonly("tp_plan", [](const PretrainedModel& model) { return plan_dict(model.tp_plan()); })
      .def_property_readonly("supports_tp_plan", &PretrainedModel::supports_tp_plan)
      .def_property_readonly("config",
                             [](const PretrainedModel& model) { return json_to_python(model.config().to_json()); })
      .def_property_readonly("tp_size", &PretrainedModel::tp_size)
      .def_property_readonly("tp_rank", &PretrainedModel::tp_rank)
      .def_property_readonly("sequence_parallel", &PretrainedModel::sequence_parallel)
      .def_property_readonly("source_dir", &PretrainedModel::source_dir)
      .def_property_readonly("plan_warnings",
                             [](const PretrainedModel& model) { return model.resolved_plan().warnings; })
      .def_property_readonly("param_styles",
                             [](const PretrainedModel& model) { return model.resolved_plan().param_style; })
      .def("forward", &model_forward, py::arg("input_ids"),
           "logits f32 [B, T, V] (full vocabulary on every rank) of ids [T] or "
           "[B, T]")
      // For bench/python: the C++ forward alone, `repeats` times, without any
      // conversion; returns the seconds of each call.
      .def(
          "_time_forward",
          [](PretrainedModel& model, const py::handle& ids, int repeats) {
            Tensor input = ids_from_python(ids, model.config().vocab_size, "input_ids");
            std::vector<double> seconds;
            py::gil_scoped_release release;
            for (int i = 0; i < repeats; ++i) {
              auto t0 = std::chrono::steady_clock::now();
              Tensor logits = model.forward(input);
              seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            return seconds;
          },
          py::arg("input_ids"), py::arg("repeats") = 1)
      .def(
          "generate",
          [](PretrainedModel& model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
             double temperature, int64_t top_k, double top_p, uint64_t seed,
             const std::vector<int64_t>& eos_token_ids) {
            for (const auto& prompt : prompts)
              ids_from_python(py::cast(prompt), model.config().vocab_size, "input_ids");
            generation::GenerateOptions options;
            options.max_new_tokens = max_new_tokens;
            options.sampling = {.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = seed};
            options.eos_token_ids = eos_token_ids;
            py::gil_scoped_release release;
            return generation::generate(model, prompts, options).tokens;
          },
          py::arg("prompts"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
          py::arg("seed"), py::arg("eos_token_ids"), "new tokens per prompt (incl. the EOS that stopped it)")
      .def(
          "save_pretrained",
          [](PretrainedModel& model, const std::filesystem::path& dir) {
            py::gil_scoped_release release;
            save_pretrained(model, dir);
          },
          py::arg("save_directory"));

  m.def(
      "from_pretrained",
      [](const std::filesystem::path& dir, std::optional<std::string> dtype, DistributedConfig dc,
         std::optional<dist::ParallelismConfig> parallelism_config, bool training, bool verbose) {
        LoadOptions options = training ? LoadOptions::for_training(dc) : LoadOptions{};
        options.distributed_config = dc;
        if (dtype) options.dtype = parse_dtype(*dtype);
        options.verbose = verbose;
        if (parallelism_config) options.mesh = parallelism_config->build_device_mesh();
        py::gil_scoped_release release;
        return AutoModelForCausalLM::from_pretrained(dir, options);
      },
      py::arg("model_dir"), py::arg("dtype"), py::arg("distributed_config"), py::arg("parallelism_config"),
      py::arg("training"), py::arg("verbose"));

  m.def(
      "default_eos_token_ids",
      [](const PretrainedModel& model) {
        std::optional<Tokenizer> tokenizer;
        if (std::filesystem::exists(model.source_dir() / "tokenizer.json"))
          tokenizer = Tokenizer::from_model_dir(model.source_dir());
        return generation::default_eos_token_ids(model, tokenizer ? &*tokenizer : nullptr);
      },
      py::arg("model"));

  m.def(
      "plan_report",
      [](const std::filesystem::path& dir, const DistributedConfig& dc, std::optional<std::string> dtype) {
        const ModelConfig config = Checkpoint::read_config(dir);
        DType d = dtype ? parse_dtype(*dtype) : (config.torch_dtype == "bfloat16" ? DType::BF16 : DType::F32);
        return json_to_python(plan_report_json(make_plan_report(config, dc, d)));
      },
      py::arg("model_dir"), py::arg("distributed_config"), py::arg("dtype") = py::none(),
      "what each rank would hold under `distributed_config` (tp plan --json), "
      "from config.json alone");

  m.def("supported_model_types", &AutoModelForCausalLM::supported_model_types);
}

}  // namespace tp::python
