#include "tp/models/decoder_args.h"

namespace tp {

const DecoderArgs& decoder_args(const nn::ForwardArgs& args, const nn::Module& module) {
  const auto* decoder = dynamic_cast<const DecoderArgs*>(&args);
  TP_CHECK(decoder != nullptr, "{}: called with arguments that are not a decoder's (DecoderArgs)", module.name());
  return *decoder;
}

}  // namespace tp
