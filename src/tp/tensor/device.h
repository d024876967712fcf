#pragma once
// Where a tensor's bytes live. Every Storage has one; today it is always the
// CPU (host memory). A second device (docs/design/cuda.md) adds its type here,
// its allocator behind Storage, and its kernels behind ops/; code above ops/
// never reads a pointer of a device it does not run on.
#include <cstdint>
#include <string>

namespace tp {

enum class DeviceType : uint8_t { CPU };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // which one of its type (always 0 for the CPU)
  bool operator==(const Device&) const = default;
};

inline std::string device_name(const Device& d) {
  switch (d.type) {
    case DeviceType::CPU:
      return "cpu";
  }
  return "unknown";
}

}  // namespace tp
