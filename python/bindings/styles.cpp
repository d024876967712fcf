// The built-in style classes, so a plan can name a configured instance
// registered from Python (Transformers' ALL_PARALLEL_STYLES.register).
#include <pybind11/stl.h>

#include "bindings.h"
#include "tp/parallel/colwise.h"
#include "tp/parallel/embedding.h"
#include "tp/parallel/registry.h"
#include "tp/parallel/replicated.h"
#include "tp/parallel/rowwise.h"
#include "tp/parallel/sequence.h"

namespace tp::python {

using nn::TensorParallelLayer;

void bind_styles(py::module_& m) {
  // Styles are immutable once made: Python holds them as shared_ptr<const ...>
  // through the base class, which is what the registry stores.
  py::class_<TensorParallelLayer, std::shared_ptr<TensorParallelLayer>>(m, "TensorParallelLayer");

  py::class_<parallel::ColwiseParallel, TensorParallelLayer, std::shared_ptr<parallel::ColwiseParallel>>(
      m, "ColwiseParallel")
      .def(py::init([](bool gather_output, int64_t split_factor) {
             return std::make_shared<parallel::ColwiseParallel>(
                 parallel::ColwiseParallel::Options{.gather_output = gather_output, .split_factor = split_factor});
           }),
           py::arg("gather_output") = false, py::arg("split_factor") = 1);
  py::class_<parallel::RowwiseParallel, TensorParallelLayer, std::shared_ptr<parallel::RowwiseParallel>>(
      m, "RowwiseParallel")
      .def(py::init([](bool split_input, int64_t split_factor) {
             return std::make_shared<parallel::RowwiseParallel>(
                 parallel::RowwiseParallel::Options{.split_input = split_input, .split_factor = split_factor});
           }),
           py::arg("split_input") = false, py::arg("split_factor") = 1);
  py::class_<parallel::EmbeddingRowwise, TensorParallelLayer, std::shared_ptr<parallel::EmbeddingRowwise>>(
      m, "EmbeddingRowwise")
      .def(py::init<>());
  py::class_<parallel::EmbeddingColwise, TensorParallelLayer, std::shared_ptr<parallel::EmbeddingColwise>>(
      m, "EmbeddingColwise")
      .def(py::init<>());
  py::class_<parallel::SequenceParallel, TensorParallelLayer, std::shared_ptr<parallel::SequenceParallel>>(
      m, "SequenceParallel")
      .def(py::init([](bool gather_output) {
             return std::make_shared<parallel::SequenceParallel>(
                 parallel::SequenceParallel::Options{.gather_output = gather_output});
           }),
           py::arg("gather_output") = false);
  py::class_<parallel::ReplicatedWithGradAllreduce, TensorParallelLayer,
             std::shared_ptr<parallel::ReplicatedWithGradAllreduce>>(m, "ReplicatedWithGradAllReduce")
      .def(py::init<>());
  py::class_<parallel::AllReduceOutput, TensorParallelLayer, std::shared_ptr<parallel::AllReduceOutput>>(
      m, "AllReduceParallel")
      .def(py::init<>());
  py::class_<parallel::LocalParams, TensorParallelLayer, std::shared_ptr<parallel::LocalParams>>(m,
                                                                                                 "LocalParamsParallel")
      .def(py::init<>());

  m.def(
      "register_style",
      [](const std::string& name, std::shared_ptr<TensorParallelLayer> style) {
        parallel::register_style(name, std::move(style));
      },
      py::arg("name"), py::arg("style"));
  m.def("style_names", &parallel::style_names);
}

}  // namespace tp::python
