// tp::Tokenizer (tokenizer.json as Transformers' fast tokenizers encode and
// decode).
#include "tp/tokenizer/tokenizer.h"

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "bindings.h"
#include "tp/chat/chat_template.h"

namespace tp::python {

void bind_tokenizer(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer")
      .def_static("from_model_dir", &Tokenizer::from_model_dir, py::arg("model_dir"))
      .def_static("from_file", &Tokenizer::from_file, py::arg("tokenizer_json"))
      .def("encode", &Tokenizer::encode, py::arg("text"), py::arg("add_special_tokens") = true,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "encode_batch",
          [](const Tokenizer& tokenizer, const std::vector<std::string>& texts, bool add_special_tokens) {
            std::vector<std::vector<int64_t>> out;
            for (const std::string& text : texts) out.push_back(tokenizer.encode(text, add_special_tokens));
            return out;
          },
          py::arg("texts"), py::arg("add_special_tokens") = true, py::call_guard<py::gil_scoped_release>())
      .def(
          "decode",
          [](const Tokenizer& tokenizer, const std::vector<int64_t>& ids, bool skip_special_tokens,
             std::optional<bool> clean_up_tokenization_spaces) {
            return clean_up_tokenization_spaces
                       ? tokenizer.decode(ids, skip_special_tokens, *clean_up_tokenization_spaces)
                       : tokenizer.decode(ids, skip_special_tokens);
          },
          py::arg("ids"), py::arg("skip_special_tokens") = false, py::arg("clean_up_tokenization_spaces") = py::none())
      .def("id_to_token", &Tokenizer::id_to_token, py::arg("id"))
      .def("token_to_id", &Tokenizer::token_to_id, py::arg("token"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("bos_token_id", &Tokenizer::bos_token_id)
      .def_property_readonly("pad_token_id", &Tokenizer::pad_token_id)
      .def_property_readonly("eos_token_ids", &Tokenizer::eos_token_ids)
      .def("is_special", &Tokenizer::is_special, py::arg("id"));

  // Messages and extra variables cross as JSON text: the template engine's values are JSON's.
  py::class_<chat::ChatTemplate>(m, "ChatTemplate")
      .def_static("from_model_dir", &chat::ChatTemplate::from_model_dir, py::arg("model_dir"))
      .def(
          "apply",
          [](const chat::ChatTemplate& t, const std::string& messages_json, bool add_generation_prompt,
             const std::string& extra_json) {
            return t.apply(nlohmann::json::parse(messages_json), add_generation_prompt,
                           nlohmann::json::parse(extra_json));
          },
          py::arg("messages_json"), py::arg("add_generation_prompt"), py::arg("extra_json") = "{}")
      .def_property_readonly("name", &chat::ChatTemplate::name)
      .def_property_readonly("source", &chat::ChatTemplate::source);
}

}  // namespace tp::python
