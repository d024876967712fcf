#pragma once
// The extension module tp._tp: one bind_* function per area, called from
// module.cpp. The Python package python/tp/ wraps these in Transformers'
// shapes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "tp/tensor/tensor.h"

namespace tp::python {

namespace py = pybind11;

// A numpy array over the tensor's memory (f32, i32, i64: no copy; the array
// keeps the storage alive). Other dtypes (bf16, f16) are converted to f32.
py::array to_numpy(const Tensor& tensor);
// Token ids from a numpy array or nested lists of ints: [T] -> [1, T], [B, T]
// as is, as an i64 tensor. `vocab_size` > 0: every id must be in [0,
// vocab_size). Errors (ValueError) name `what` and the bad shape or id.
Tensor ids_from_python(const py::handle& ids, int64_t vocab_size, const char* what);

// A JSON value (nlohmann::json or ordered_json) as Python objects; objects keep
// their order.
template <class Json>
py::object json_to_python(const Json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

void bind_errors(py::module_& m);
void bind_models(py::module_& m);
void bind_tokenizer(py::module_& m);
void bind_styles(py::module_& m);
void bind_training(py::module_& m);

}  // namespace tp::python
