#include "tp/ops/dispatch.h"

#include <string>

namespace tp::ops {

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (first == nullptr) {
      first = t;
    } else {
      TP_CHECK(t->device() == first->device(), "{}: tensors on {} and {}; move them to one device first", op,
               device_name(first->device()), device_name(t->device()));
    }
  }
  return first == nullptr ? Device{} : first->device();
}

}  // namespace tp::ops
