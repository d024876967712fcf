// numpy <-> tp::Tensor, and tp's errors as Python exceptions.
#include <cstring>

#include "bindings.h"
#include "tp/core/error.h"

namespace tp::python {

py::array to_numpy(const Tensor& tensor) {
  Tensor t = tensor;  // tp's tensors are always contiguous
  if (t.dtype() != DType::F32 && t.dtype() != DType::I32 && t.dtype() != DType::I64) t = t.to(DType::F32);
  py::dtype dtype = t.dtype() == DType::F32   ? py::dtype::of<float>()
                    : t.dtype() == DType::I32 ? py::dtype::of<int32_t>()
                                              : py::dtype::of<int64_t>();
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  // The capsule owns a Tensor handle: the array's memory lives as long as the
  // array.
  auto* owner = new Tensor(t);
  py::capsule base(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(dtype, shape, {}, t.raw_data(), base);
}

Tensor ids_from_python(const py::handle& ids, int64_t vocab_size, const char* what) {
  py::array array;
  try {
    array = py::array::ensure(ids);
  } catch (const py::error_already_set&) {
  }
  if (!array || array.size() == 0)
    throw UsageError(
        fmt::format("{}: expected a non-empty array of token ids "
                    "(numpy array or list of ints)",
                    what));
  if (array.dtype().kind() != 'i' && array.dtype().kind() != 'u')
    throw UsageError(fmt::format("{}: token ids must be integers, got an array of dtype '{}'", what,
                                 py::str(array.dtype()).cast<std::string>()));
  if (array.ndim() != 1 && array.ndim() != 2)
    throw UsageError(fmt::format("{}: expected shape [seq] or [batch, seq], got {} dimensions", what, array.ndim()));
  auto i64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
  int64_t batch = array.ndim() == 2 ? array.shape(0) : 1;
  int64_t seq = array.shape(array.ndim() - 1);
  // Ids are a few numbers per token: copying them costs nothing next to a
  // forward.
  Tensor out = Tensor::empty({batch, seq}, DType::I64);
  std::memcpy(out.raw_data(), i64.data(), static_cast<size_t>(batch * seq) * sizeof(int64_t));
  if (vocab_size > 0) {
    const int64_t* p = out.data<int64_t>();
    for (int64_t i = 0; i < batch * seq; ++i)
      if (p[i] < 0 || p[i] >= vocab_size)
        throw UsageError(
            fmt::format("{}: token id {} (row {}, position {}) is "
                        "outside the vocabulary [0, {})",
                        what, p[i], i / seq, i % seq, vocab_size));
  }
  return out;
}

void bind_errors(py::module_& m) {
  // tp::Error -> tp.TpError (a RuntimeError); tp::UsageError (a bad argument)
  // -> ValueError.
  static py::exception<Error> tp_error(m, "TpError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      tp_error(e.what());
    }
  });
}

}  // namespace tp::python
