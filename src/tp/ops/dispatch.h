#pragma once
// The device seam. Every family of ops (norms, attention, the loss, ...) keeps
// its kernels in one struct of function pointers, and one KernelTable per
// family holds that struct for each DeviceType. An op in ops/<family>.cpp keeps
// what is device-neutral (argument checks, output shapes, autograd recording)
// and runs its arithmetic through `table.on(tensors...)`, which picks the
// kernels of the device its tensors live on.
//
// The CPU entries are the table's initial values. A second device's library
// fills its own with KernelTable::set from one registration function called at
// start-up (docs/design/cuda.md §3.1), not from static initialisers, which a
// static library's linker may drop.
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>

#include "tp/core/error.h"
#include "tp/tensor/tensor.h"

namespace tp::ops {

inline constexpr size_t kDeviceTypeCount = 1;  // DeviceType's enumerators (tensor/device.h)

inline size_t device_type_index(DeviceType type) { return static_cast<size_t>(type); }

// The one device every defined tensor of `op` lives on (the CPU when none is defined).
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors);

template <class Kernels>
class KernelTable {
 public:
  KernelTable(const char* op_family, const Kernels* cpu) : family_(op_family) {
    entries_[device_type_index(DeviceType::CPU)] = cpu;
  }
  KernelTable(const KernelTable&) = delete;
  KernelTable& operator=(const KernelTable&) = delete;

  // Installs (or, with nullptr, removes) a device's kernels.
  void set(DeviceType type, const Kernels* kernels) { entries_[device_type_index(type)] = kernels; }
  const Kernels* get(DeviceType type) const { return entries_[device_type_index(type)]; }

  // The kernels for the device that every defined tensor lives on; the first
  // defined tensor's dtype names what was asked for when the device has none.
  template <class... T>
  const Kernels& on(const T&... tensors) const {
    return on_device(common_device(family_, {&tensors...}), first_dtype({&tensors...}));
  }
  const Kernels& on_device(const Device& device, DType dtype = DType::F32) const {
    lookups_.fetch_add(1, std::memory_order_relaxed);
    const Kernels* k = entries_[device_type_index(device.type)];
    TP_CHECK(k != nullptr, "{}: no kernel for {} on {}", family_, dtype_name(dtype), device_name(device));
    return *k;
  }

  const char* family() const { return family_; }
  // How many times an op asked this table for kernels: tests check that an op
  // reaches its kernels through the table and nowhere else.
  uint64_t lookups() const { return lookups_.load(std::memory_order_relaxed); }

 private:
  static DType first_dtype(std::initializer_list<const Tensor*> tensors) {
    for (const Tensor* t : tensors)
      if (t->defined()) return t->dtype();
    return DType::F32;
  }

  const char* family_;
  std::array<const Kernels*, kDeviceTypeCount> entries_{};
  mutable std::atomic<uint64_t> lookups_{0};
};

}  // namespace tp::ops
