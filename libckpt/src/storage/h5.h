// storage/h5.h: the thin layer over HDF5's C API. The only headers that include <hdf5.h>
// live in storage/.
//
// Threading: Debian's HDF5 is thread-safe through one global lock; calls from several
// threads are serialised by HDF5 itself. Data never goes through HDF5 on the fast path
// (see shard_writer.cc), so the lock is held only for metadata work.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/error.h"

namespace ckpt::h5 {

// Silences HDF5's automatic error printing, turns off loading of plugins (filters from
// the machine's plugin directory), registers the zstd filter and has Shutdown run at
// exit instead of HDF5's own exit handler. Idempotent; called before any file is opened.
void Init();

// Terminates HDF5 (closes what is left open, frees its memory), unless closing a file
// has failed: HDF5 1.10 cannot then terminate without crashing, and the process is about
// to end anyway. Runs at exit; idempotent; no HDF5 call may follow it.
void Shutdown();

// Held by a thread for a run of HDF5 calls that other threads should not interleave with
// (ShardWriter's batches of datasets): HDF5's global lock is taken and released by every
// call, and threads that contend for it hand it over call by call, each handover a wakeup.
// Only a hint: HDF5 stays thread-safe without it. Never held while waiting for anything else.
std::mutex& BatchMutex();

// H5Fclose, remembering a failure for Shutdown. File() handles close with it.
herr_t CloseFile(hid_t id);

// The innermost message of HDF5's current error stack ("" if none).
std::string ErrorStack();

// Throws kIO with `what` and HDF5's error stack if `status` is negative.
template <typename T>
T Check(T status, const std::string& what) {
  if (status < 0) throw Error(ErrorCode::kIO, what + ErrorStack());
  return status;
}

// One owner per hid_t, closed with the right function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~Handle() { Reset(); }
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  // Closes now and reports failure (closing a file flushes it).
  herr_t Close() {
    herr_t r = 0;
    if (id_ >= 0 && closer_) r = closer_(id_);
    id_ = -1;
    return r;
  }

 private:
  void Reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

inline Handle File(hid_t id) { return Handle(id, CloseFile); }
inline Handle Dataset(hid_t id) { return Handle(id, H5Dclose); }
inline Handle Space(hid_t id) { return Handle(id, H5Sclose); }
inline Handle Type(hid_t id) { return Handle(id, H5Tclose); }
inline Handle Plist(hid_t id) { return Handle(id, H5Pclose); }
inline Handle Attr(hid_t id) { return Handle(id, H5Aclose); }

// Holds a file's metadata cache at `bytes`, neither grown nor shrunk by HDF5's adaptive
// resizing (which takes it to 32 MiB): a reader or writer that visits each dataset once
// keeps its memory small, as the least recently used headers make room for the next.
void SetFixedMetadataCache(hid_t fapl, std::size_t bytes);

// The HDF5 file type of a ckpt dtype (FORMAT.md §4). bfloat16 and fp8 are unsigned
// integers carrying a `dtype` attribute; float16 is a 2-byte IEEE float.
Handle FileType(DType dtype);
// FileType(dtype), created once per process and never closed (for hot paths: thousands of
// datasets of the same few types).
hid_t SharedFileType(DType dtype);
// True if `dtype` needs the `dtype` attribute to be recognised.
bool NeedsDTypeAttr(DType dtype);
// True if an HDF5 dataset type `type` stores elements of `dtype` as FileType(dtype) would.
bool TypeMatches(hid_t type, DType dtype);

// A dataspace of `dims` (scalar when empty).
Handle MakeSpace(const std::vector<hsize_t>& dims);

void WriteStringAttr(hid_t obj, const char* name, const std::string& value);
// Empty if absent.
std::string ReadStringAttr(hid_t obj, const char* name);

// The bytes of an open HDF5 file as ckpt reads them itself (pread on `fd`, the very file
// HDF5 has open), and what its superblock says about addresses: for checking an object
// header before HDF5 parses it (CheckObjectHeader).
struct RawFile {
  int fd = -1;
  uint64_t size = 0;         // bytes
  uint64_t base = 0;         // absolute offset of HDF5 address 0 (the user block's size)
  unsigned sizeof_addr = 8;  // bytes of an address and of a length in the file
  unsigned sizeof_size = 8;
};
RawFile DescribeFile(hid_t file, int fd, uint64_t size);

// Checks, from the file's bytes and without HDF5, the object header at HDF5 address `addr`
// for what the format forbids a shard's dataset and what HDF5 1.10 must not be left to
// parse (FORMAT.md §5.6): every layout message must be readable and contiguous, chunked
// or compact (a virtual dataset's layout points into the global heap, and HDF5 1.10
// crashes on a corrupt one inside H5Dopen2), and there must be no external-file-list
// message (external storage; its local heap is another such parse). Fails closed: a
// header this cannot walk (v1 or v2, continuation chunks included, within bounds) is
// refused. Returns "" when acceptable, else why not.
std::string CheckObjectHeader(const RawFile& raw, haddr_t addr);

// Opens dataset `name` of the root group of `file`, refusing (kCorrupt, `where` first)
// anything but a plain link name that is a hard link: a soft, external or user-defined
// link would reach other objects or other files (FORMAT.md §5.6); and a dataset whose
// object header CheckObjectHeader refuses, before HDF5 opens it.
Handle OpenOwnDataset(hid_t file, const RawFile& raw, const std::string& name, const std::string& where);
// The same without building `where`: an invalid handle and, in `problem`, why (the text
// OpenOwnDataset puts after `where`).
Handle TryOpenOwnDataset(hid_t file, const RawFile& raw, const std::string& name, std::string& problem);
// The same for the hard link `name` whose object is at `addr` (as VisitRootLinks gave it):
// the header checked, the dataset opened by its address, with no lookup of the name.
Handle TryOpenOwnDatasetAt(hid_t file, const RawFile& raw, const std::string& name, haddr_t addr,
                           std::string& problem);
// Calls visit(name, info) for each link of the root group of `file`, in one pass (link
// index order), until it returns false; the metadata cache is widened for the pass to
// hold the root's link index (about 48 bytes a link), so that each of its blocks is read
// once whatever the number of links. HDF5 errors end the pass (cleared).
void VisitRootLinks(hid_t file, const std::function<bool(const char*, const H5L_info_t&)>& visit);
// Links of the root group of `file` that are not hard links (soft, external,
// user-defined), at most `limit`, in name order; and how such a link is refused.
std::vector<std::pair<std::string, H5L_type_t>> ForeignLinks(hid_t file, std::size_t limit);
std::string ForeignLinkMessage(const std::string& name, H5L_type_t type);
// Hard links of the root group of `file` for which `named(name)` is false, at most
// `limit`, in name order: objects a shard should not hold (FORMAT.md §5.6).
std::vector<std::string> UnnamedHardLinks(hid_t file, const std::function<bool(const std::string&)>& named,
                                          std::size_t limit);
// Refuses (kCorrupt, `where` first) a dataset whose creation properties `dcpl` reach
// outside its file (a virtual dataset, external storage) or name a filter other than
// those of FORMAT.md §6 (shuffle, zstd), naming the filter's id.
void CheckStorage(hid_t dcpl, const std::string& where);

// Dataset names (FORMAT.md §5): the key escaped, plus "@o0,o1,..." for a partial chunk.
std::string EscapeKey(const std::string& key);
std::string DatasetName(const std::string& key, const std::vector<int64_t>& offsets, bool whole);

}  // namespace ckpt::h5
