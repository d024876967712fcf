// tp._tp: the compiled half of the Python module `tp`.
#include "bindings.h"
#include "tp/version.h"

PYBIND11_MODULE(_tp, m) {
  m.doc() =
      "tp: tensor-parallel inference and training of Hugging Face "
      "transformer models (compiled core)";
  m.attr("__version__") = TP_VERSION;
  tp::python::bind_errors(m);
  tp::python::bind_models(m);
  tp::python::bind_tokenizer(m);
  tp::python::bind_styles(m);
  tp::python::bind_training(m);
}
