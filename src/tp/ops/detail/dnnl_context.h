#pragma once
// The oneDNN CPU engine and this thread's stream, shared by every oneDNN user in ops/.
#include <oneapi/dnnl/dnnl.hpp>

namespace tp::ops::detail {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();  // one per thread: streams are not meant to be shared

}  // namespace tp::ops::detail
