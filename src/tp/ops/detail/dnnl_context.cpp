#include "tp/ops/detail/dnnl_context.h"

namespace tp::ops::detail {

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream stream(dnnl_engine());
  return stream;
}

}  // namespace tp::ops::detail
