// checkpoint/device_io.cc: the device backend registry and the staging pipelines.
#include "checkpoint/device_io.h"

#include <algorithm>
#include <mutex>

#include "checkpoint/reader.h"
#include "ckpt/error.h"
#include "storage/digest.h"
#include "storage/shard_writer.h"

namespace ckpt {
namespace {

std::mutex registry_mu;
std::shared_ptr<DeviceBackend>& Registered() {
  static std::shared_ptr<DeviceBackend> backend;
  return backend;
}

}  // namespace

void SetDeviceBackend(std::shared_ptr<DeviceBackend> backend) {
  std::lock_guard lock(registry_mu);
  Registered() = std::move(backend);
}

std::shared_ptr<DeviceBackend> GetDeviceBackend() {
  std::lock_guard lock(registry_mu);
  return Registered();
}

namespace internal {

std::shared_ptr<DeviceBackend> DeviceBackendFor(const StateDict& state, const std::string& op) {
  std::shared_ptr<DeviceBackend> backend;
  for (const auto& [key, entry] : state) {
    const auto* t = std::get_if<Tensor>(&entry);
    if (!t) continue;
    for (const Chunk& c : t->chunks) {
      if (c.device == kHostDevice) continue;
      const std::string what = op + ": tensor '" + PrintableKey(key) + "' chunk " + c.box.ToString() + " on device " +
                               std::to_string(c.device);
      if (c.device < 0) {
        throw Error(ErrorCode::kInvalidArgument, what + ": a device id is >= 0 (kHostDevice, -1, is host memory)");
      }
      if (!backend) backend = GetDeviceBackend();
      if (!backend) {
        throw Error(ErrorCode::kInvalidArgument,
                    what + ": no device backend is registered (link ckpt::cuda and call ckpt::cuda::Register())");
      }
      const int64_t elements = c.box.NumElements();
      if (elements > 0) backend->CheckMemory(c.data, static_cast<std::size_t>(elements) * DTypeSize(t->dtype), c.device, what);
    }
  }
  return backend;
}

DeviceReader::DeviceReader(DeviceStaging& staging, std::vector<Source> sources)
    : staging_(&staging), sources_(std::move(sources)) {}

DeviceReader::~DeviceReader() {
  for (int s = 0; s < 2; ++s) {
    if (!slots_[s].busy) continue;
    slots_[s].busy = false;
    try {
      staging_->Wait(s);
    } catch (...) {  // the error that unwinds us is the one to report
    }
  }
}

bool DeviceReader::Enqueue(int slot) {
  while (src_ < sources_.size() && offset_ >= sources_[src_].bytes) {
    ++src_;
    offset_ = 0;
  }
  if (src_ == sources_.size()) return false;
  const Source& s = sources_[src_];
  const std::size_t n = std::min(staging_->buffer_bytes(), s.bytes - offset_);
  staging_->CopyToHostAsync(slot, static_cast<const uint8_t*>(s.data) + offset_, n, s.device);
  slots_[slot] = Slot{true, n, src_};
  offset_ += n;
  return true;
}

const void* DeviceReader::Next(std::size_t& n, std::size_t& source) {
  // The slot handed out last is free again: the caller is done with its piece.
  int slot = 0;
  if (started_) {
    slot = current_ ^ 1;
  } else {
    started_ = true;
    Enqueue(0);
  }
  if (!slots_[slot].busy) return nullptr;  // every piece handed out
  Enqueue(slot ^ 1);  // the piece after this one, copied while the caller works
  slots_[slot].busy = false;
  staging_->Wait(slot);
  current_ = slot;
  n = slots_[slot].n;
  source = slots_[slot].source;
  return staging_->buffer(slot);
}

DeviceWriter::~DeviceWriter() {
  try {
    Finish();
  } catch (...) {  // the error that unwinds us is the one to report
  }
}

void* DeviceWriter::Buffer() {
  if (busy_[slot_]) {
    busy_[slot_] = false;
    staging_->Wait(slot_);
  }
  return staging_->buffer(slot_);
}

void DeviceWriter::Send(void* dst, std::size_t n, int device) {
  staging_->CopyToDeviceAsync(slot_, dst, n, device);
  busy_[slot_] = true;
  slot_ ^= 1;
}

void DeviceWriter::Finish() {
  for (int s = 0; s < 2; ++s) {
    if (!busy_[s]) continue;
    busy_[s] = false;
    staging_->Wait(s);
  }
}

void ForEachContiguousPiece(const Box& box, std::size_t item, std::size_t max_bytes,
                            const std::function<void(const Box&, std::size_t, std::size_t)>& fn) {
  const int64_t elements = box.NumElements();
  if (elements == 0) return;
  const std::size_t total = static_cast<std::size_t>(elements) * item;
  if (total <= max_bytes) return fn(box, 0, total);
  // The outermost dimension d whose rows (the bytes of one index along d) fit.
  const std::size_t rank = box.sizes.size();
  std::vector<std::size_t> row(rank);  // row[d]: bytes of one index along dimension d
  std::size_t inner = item;
  for (std::size_t d = rank; d-- > 0;) {
    row[d] = inner;
    inner *= static_cast<std::size_t>(box.sizes[d]);
  }
  std::size_t d = 0;
  while (row[d] > max_bytes) ++d;  // row[rank - 1] == item <= max_bytes
  const std::size_t per_piece = max_bytes / row[d];
  const auto extent = static_cast<std::size_t>(box.sizes[d]);
  std::size_t outer = 1;  // index combinations of the dimensions before d
  for (std::size_t k = 0; k < d; ++k) outer *= static_cast<std::size_t>(box.sizes[k]);
  Box piece = box;
  for (std::size_t o = 0; o < outer; ++o) {
    std::size_t rem = o;
    for (std::size_t k = d; k-- > 0;) {
      piece.offsets[k] = box.offsets[k] + static_cast<int64_t>(rem % static_cast<std::size_t>(box.sizes[k]));
      piece.sizes[k] = 1;
      rem /= static_cast<std::size_t>(box.sizes[k]);
    }
    for (std::size_t j = 0; j < extent; j += per_piece) {
      const std::size_t take = std::min(per_piece, extent - j);
      piece.offsets[d] = box.offsets[d] + static_cast<int64_t>(j);
      piece.sizes[d] = static_cast<int64_t>(take);
      fn(piece, (o * extent + j) * row[d], take * row[d]);
    }
  }
}

ChunkMeta WriteDeviceChunk(storage::ShardWriter& writer, DeviceReader& pieces, const std::string& key,
                           const Tensor& t, const Chunk& c) {
  const std::size_t n = static_cast<std::size_t>(c.box.NumElements()) * DTypeSize(t.dtype);
  std::size_t got = 0, source = 0;
  const auto next = [&] {
    const void* piece = pieces.Next(got, source);
    if (!piece) {
      throw Error(ErrorCode::kInternal, "save: tensor '" + PrintableKey(key) + "' chunk " + c.box.ToString() +
                                            ": the device staging ran out of pieces");
    }
    return piece;
  };
  const void* piece = next();
  if (got == n) return writer.WriteChunk(key, t.dtype, t.shape, c.box, piece);
  auto stream = writer.Begin(key, t.dtype, t.shape, c.box);
  for (std::size_t done = 0;;) {
    stream->Write(piece, got);
    done += got;
    if (done == n) break;
    piece = next();
  }
  return stream->Finish();
}

void ReadDeviceChunk(Reader& reader, DeviceWriter& out, const std::string& key, const Chunk& c, std::size_t item,
                     bool verify) {
  auto* base = static_cast<uint8_t*>(c.data);
  ForEachContiguousPiece(c.box, item, out.capacity(), [&](const Box& piece, std::size_t offset, std::size_t n) {
    void* buffer = out.Buffer();
    reader.ReadRegion(key, piece, buffer, verify);
    out.Send(base + offset, n, c.device);
  });
}

std::string DeviceChecksum(DeviceStaging& staging, const void* data, std::size_t n, int device) {
  storage::Digest digest(DType::kUInt8, /*with_stats=*/false);
  DeviceReader reader(staging, {DeviceReader::Source{data, n, device}});
  std::size_t got = 0, source = 0;
  while (const void* piece = reader.Next(got, source)) digest.Update(piece, got);
  return digest.Checksum();
}

}  // namespace internal
}  // namespace ckpt
