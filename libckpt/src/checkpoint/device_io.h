// checkpoint/device_io.h: the core's side of ckpt/device.h. Save and Load hand device chunks
// to these helpers, which move their bytes through a backend's two pinned staging buffers
// with the copy of one piece overlapping the work on the other.
//
// Threading: a pipeline belongs to one thread (that of the DeviceStaging it holds).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/device.h"
#include "ckpt/metadata.h"
#include "ckpt/tensor.h"

namespace ckpt::storage {
class ShardWriter;
}

namespace ckpt::internal {

class Reader;

// The registered backend if any tensor chunk of `state` is on a device (each checked by the
// backend: its device and memory), else nullptr. Throws kInvalidArgument naming the key when
// a device chunk meets no registered backend. `op` ("save", "load") starts the messages.
std::shared_ptr<DeviceBackend> DeviceBackendFor(const StateDict& state, const std::string& op);

// Device memory to the host, piece by piece: while the caller works on piece i (in one
// staging buffer), piece i+1 is being copied into the other. The sources are read in order,
// each in pieces of at most buffer_bytes(); a source of 0 bytes gives no piece.
class DeviceReader {
 public:
  struct Source {
    const void* data;
    std::size_t bytes;
    int device;
  };
  DeviceReader(DeviceStaging& staging, std::vector<Source> sources);
  ~DeviceReader();  // waits for a copy still in flight
  DeviceReader(const DeviceReader&) = delete;
  DeviceReader& operator=(const DeviceReader&) = delete;

  // The next piece of the current source (valid until the next call), or nullptr once every
  // source is done. `n` gets its length, `source` its source's index.
  const void* Next(std::size_t& n, std::size_t& source);

 private:
  bool Enqueue(int slot);  // the piece after the last enqueued one; false at the end
  DeviceStaging* staging_;
  std::vector<Source> sources_;
  std::size_t src_ = 0, offset_ = 0;  // the next piece to enqueue
  struct Slot {
    bool busy = false;
    std::size_t n = 0, source = 0;
  } slots_[2];
  int current_ = 0;  // the slot handed out last (or to be handed out first)
  bool started_ = false;
};

// The host to device memory: Buffer() is a staging buffer to fill (its previous copy waited
// for), Send() enqueues its copy and flips to the other buffer. Finish() waits for both.
class DeviceWriter {
 public:
  explicit DeviceWriter(DeviceStaging& staging) : staging_(&staging) {}
  ~DeviceWriter();  // waits quietly for copies still in flight
  DeviceWriter(const DeviceWriter&) = delete;
  DeviceWriter& operator=(const DeviceWriter&) = delete;

  std::size_t capacity() const { return staging_->buffer_bytes(); }
  void* Buffer();
  void Send(void* dst, std::size_t n, int device);
  void Finish();

 private:
  DeviceStaging* staging_;
  bool busy_[2] = {false, false};
  int slot_ = 0;
};

// The pieces of a chunk of `box` (elements of `item` bytes, row-major) that are each
// contiguous in its memory and at most `max_bytes` long (max_bytes >= item): fn(sub-box,
// byte offset in the chunk, bytes). Whole when the chunk fits; else runs of rows along the
// outermost dimension whose rows fit. An empty box gives no piece.
void ForEachContiguousPiece(const Box& box, std::size_t item, std::size_t max_bytes,
                            const std::function<void(const Box&, std::size_t, std::size_t)>& fn);

// Save: writes device chunk `c` of tensor `t`, whose pieces come next from `pieces`. A chunk
// that fits one staging buffer is written as a host chunk would be (compressed if the shard
// is); a larger one is streamed piece by piece, stored uncompressed.
ChunkMeta WriteDeviceChunk(storage::ShardWriter& writer, DeviceReader& pieces, const std::string& key,
                           const Tensor& t, const Chunk& c);
// Load: reads target chunk `c` (on a device) of `key` piece by piece into staging buffers,
// each copied to the device while the next is read.
void ReadDeviceChunk(Reader& reader, DeviceWriter& out, const std::string& key, const Chunk& c, std::size_t item,
                     bool verify);

// The v1 checksum of `n` bytes at `data` on `device`, copied through `staging`.
std::string DeviceChecksum(DeviceStaging& staging, const void* data, std::size_t n, int device);

}  // namespace ckpt::internal
