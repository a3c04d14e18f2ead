// ckpt/device.h: tensors in accelerator memory, and the seam through which libckpt copies
// them. No CUDA type appears here: ckpt::cuda (ckpt/cuda.h) implements this interface and
// registers itself; the core never needs CUDA.
//
// A Chunk whose `device` is not kHostDevice holds `data` in the memory of that device.
// Save copies such chunks through the registered backend's pinned staging buffers, piece by
// piece (two buffers: the copy of piece i+1 runs while piece i is hashed and written); Load
// reads each piece into a staging buffer and copies it to the device while the next piece is
// read. Meeting a device chunk with no backend registered, Save and Load fail with
// kInvalidArgument naming the key.
//
// Thread-safety: the registry is safe to use from any thread; a DeviceStaging is used by one
// thread at a time; a DeviceBackend is shared by every thread of every save and load.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ckpt/export.h"
#include "ckpt/tensor.h"  // Chunk::device, kHostDevice

namespace ckpt {

// Two pinned host buffers of buffer_bytes() each (slots 0 and 1) and an ordered copy queue
// of their own (CUDA: a stream and an event per slot). The protocol: a copy into or out of a
// slot is enqueued, then waited for with Wait(slot) before the slot's bytes are read (to the
// host) or rewritten (to the device); at most one copy per slot is in flight.
class CKPT_API DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  virtual std::size_t buffer_bytes() const = 0;
  virtual void* buffer(int slot) = 0;
  // Enqueues n <= buffer_bytes() bytes from `src` in the memory of `device` into buffer(slot).
  virtual void CopyToHostAsync(int slot, const void* src, std::size_t n, int device) = 0;
  // Enqueues n bytes from buffer(slot) to `dst` in the memory of `device`.
  virtual void CopyToDeviceAsync(int slot, void* dst, std::size_t n, int device) = 0;
  // Blocks until the copy enqueued on `slot` has finished; throws kIO on a device error.
  virtual void Wait(int slot) = 0;
};

class CKPT_API DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual std::string name() const = 0;  // "cuda"
  // Throws kInvalidArgument (message starting with `what`) unless [ptr, ptr + n) is memory of
  // `device` that this backend can copy.
  virtual void CheckMemory(const void* ptr, std::size_t n, int device, const std::string& what) = 0;
  // A staging pair for one thread. Buffers are pinned once and pooled: destroying the
  // handle returns them to the backend, and the next Acquire reuses them.
  virtual std::unique_ptr<DeviceStaging> AcquireStaging() = 0;
};

// Registers `backend` for every later Save and Load of device chunks (nullptr: none). A save
// or load in progress keeps the backend it started with.
CKPT_API void SetDeviceBackend(std::shared_ptr<DeviceBackend> backend);
CKPT_API std::shared_ptr<DeviceBackend> GetDeviceBackend();

}  // namespace ckpt
