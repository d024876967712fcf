// TrainingArguments, token data and the Trainer. train() releases the GIL: the
// Trainer's steps are all C++.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "bindings.h"
#include "tp/training/trainer.h"

namespace tp::python {

void bind_training(py::module_& m) {
  using training::TrainingArguments;
  py::class_<TrainingArguments>(m, "TrainingArguments")
      .def(py::init<>())
      .def_readwrite("output_dir", &TrainingArguments::output_dir)
      .def_readwrite("num_train_epochs", &TrainingArguments::num_train_epochs)
      .def_readwrite("max_steps", &TrainingArguments::max_steps)
      .def_readwrite("per_device_train_batch_size", &TrainingArguments::per_device_train_batch_size)
      .def_readwrite("per_device_eval_batch_size", &TrainingArguments::per_device_eval_batch_size)
      .def_readwrite("gradient_accumulation_steps", &TrainingArguments::gradient_accumulation_steps)
      .def_readwrite("learning_rate", &TrainingArguments::learning_rate)
      .def_readwrite("weight_decay", &TrainingArguments::weight_decay)
      .def_readwrite("adam_beta1", &TrainingArguments::adam_beta1)
      .def_readwrite("adam_beta2", &TrainingArguments::adam_beta2)
      .def_readwrite("adam_epsilon", &TrainingArguments::adam_epsilon)
      .def_readwrite("max_grad_norm", &TrainingArguments::max_grad_norm)
      .def_readwrite("lr_scheduler_type", &TrainingArguments::lr_scheduler_type)
      .def_readwrite("warmup_steps", &TrainingArguments::warmup_steps)
      .def_readwrite("optim", &TrainingArguments::optim)
      .def_readwrite("optim_args", &TrainingArguments::optim_args)
      .def_readwrite("logging_steps", &TrainingArguments::logging_steps)
      .def_readwrite("logging_first_step", &TrainingArguments::logging_first_step)
      .def_readwrite("eval_strategy", &TrainingArguments::eval_strategy)
      .def_readwrite("eval_steps", &TrainingArguments::eval_steps)
      .def_readwrite("save_strategy", &TrainingArguments::save_strategy)
      .def_readwrite("save_steps", &TrainingArguments::save_steps)
      .def_readwrite("save_total_limit", &TrainingArguments::save_total_limit)
      .def_readwrite("seed", &TrainingArguments::seed)
      .def_readwrite("data_seed", &TrainingArguments::data_seed)
      .def_readwrite("bf16", &TrainingArguments::bf16)
      .def_readwrite("loss_parallel", &TrainingArguments::loss_parallel)
      .def_readwrite("disable_tqdm", &TrainingArguments::disable_tqdm)
      .def_readwrite("ddp_bucket_cap_mb", &TrainingArguments::ddp_bucket_cap_mb)
      .def_readwrite("gradient_checkpointing", &TrainingArguments::gradient_checkpointing)
      // A dict (Transformers' gradient_checkpointing_kwargs), through JSON.
      .def_property(
          "gradient_checkpointing_kwargs",
          [](const TrainingArguments& args) { return json_to_python(args.gradient_checkpointing_kwargs); },
          [](TrainingArguments& args, const py::object& kwargs) {
            const std::string text = py::module_::import("json").attr("dumps")(kwargs).cast<std::string>();
            args.gradient_checkpointing_kwargs = nlohmann::json::parse(text);
          })
      // Transformers' fsdp ("full_shard", "shard_grad_op", ...) and fsdp_config (a dict).
      .def_readwrite("fsdp", &TrainingArguments::fsdp)
      .def_property(
          "fsdp_config", [](const TrainingArguments& args) { return json_to_python(args.fsdp_config); },
          [](TrainingArguments& args, const py::object& config) {
            const std::string text = py::module_::import("json").attr("dumps")(config).cast<std::string>();
            args.fsdp_config = nlohmann::json::parse(text);
          })
      .def("validate", &TrainingArguments::validate)
      .def("to_dict", [](const TrainingArguments& args) { return json_to_python(args.to_json()); });

  using training::TokenBlocks;
  py::class_<TokenBlocks, std::shared_ptr<TokenBlocks>>(m, "TokenBlocks")
      .def_static(
          "from_files",
          [](const std::vector<std::filesystem::path>& files, const Tokenizer& tokenizer, int64_t seq_len,
             const std::string& sample_by) {
            py::gil_scoped_release release;
            return std::make_shared<TokenBlocks>(
                TokenBlocks::from_files(files, tokenizer, {.seq_len = seq_len, .sample_by = sample_by}));
          },
          py::arg("files"), py::arg("tokenizer"), py::arg("seq_len") = 1024, py::arg("sample_by") = "line")
      .def_static(
          "from_tokens",
          [](std::vector<int32_t> tokens, int64_t seq_len) {
            return std::make_shared<TokenBlocks>(TokenBlocks::from_tokens(std::move(tokens), seq_len));
          },
          py::arg("tokens"), py::arg("seq_len"))
      .def("__len__", &TokenBlocks::size)
      .def_property_readonly("seq_len", &TokenBlocks::seq_len)
      .def_property_readonly("num_tokens", &TokenBlocks::num_tokens);

  py::class_<training::TrainOutput>(m, "TrainOutput")
      .def_readonly("global_step", &training::TrainOutput::global_step)
      .def_readonly("training_loss", &training::TrainOutput::training_loss)
      .def_property_readonly("metrics", [](const training::TrainOutput& o) { return json_to_python(o.metrics); });

  py::class_<Trainer>(m, "Trainer")
      .def(py::init([](PretrainedModel& model, TrainingArguments args, std::shared_ptr<TokenBlocks> train,
                       std::shared_ptr<TokenBlocks> eval) {
             py::gil_scoped_release release;
             return std::make_unique<Trainer>(model, std::move(args), std::move(train), std::move(eval));
           }),
           py::arg("model"), py::arg("args"), py::arg("train_dataset"), py::arg("eval_dataset") = nullptr,
           // The Trainer refers to the model and the data: they live at least
           // as long as it.
           py::keep_alive<1, 2>(), py::keep_alive<1, 4>(), py::keep_alive<1, 5>())
      .def("train", &Trainer::train, py::arg("resume_from_checkpoint") = "", py::call_guard<py::gil_scoped_release>())
      .def("evaluate",
           [](Trainer& trainer) {
             nlohmann::json metrics;
             {
               py::gil_scoped_release release;
               metrics = trainer.evaluate();
             }
             return json_to_python(metrics);
           })
      .def("save_model", &Trainer::save_model, py::arg("output_dir") = "", py::call_guard<py::gil_scoped_release>())
      .def("save_checkpoint", &Trainer::save_checkpoint, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("state", [](const Trainer& trainer) { return json_to_python(trainer.state().to_json()); })
      .def_property_readonly("dp_size", &Trainer::dp_size)
      .def_property_readonly("dp_rank", &Trainer::dp_rank);
}

}  // namespace tp::python
