// checkpoint/check.cc: VerifyCheckpoint (ckpt/verify.h).
//
// The calling thread reads metadata.json (a caller's check of its text runs on another
// thread meanwhile), checks the files and the tiling, then checks every dataset's own HDF5
// header (ShardReader without the shard index) file by file, while data threads (no more
// than the cores) hash the files it has checked, each in file order (see DataRun). Memory
// stays bounded whatever the size: each data thread maps one window (32 MiB) or holds one
// block (kBlockBytes, a filtered chunk) at a time.
#include "ckpt/verify.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "checkpoint/object_read.h"
#include "checkpoint/object_save.h"
#include "checkpoint/reader.h"
#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "format/checked.h"
#include "format/grid.h"
#include "format/names.h"
#include "storage/digest.h"
#include "storage/file_hasher.h"
#include "storage/fs.h"
#include "storage/pool.h"
#include "storage/shard_reader.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kBlockBytes = uint64_t{8} << 20;

// A chunk whose data is read: its checksum recomputed and/or its elements checked.
struct DataJob {
  // Into the metadata or the group's catalog, which outlive the job (no copy per chunk).
  const std::string* key = nullptr;
  DType dtype = DType::kUInt8;
  const ChunkMeta* chunk = nullptr;  // bytes entries: their 1-D extent, as parsed
  const std::string& file() const { return chunk->file; }
  bool hash = true, finite = false;
  bool recorded_nonfinite = false;  // quick --check-finite: the recorded statistics count NaN/Inf
  // Filled by the data threads:
  bool located = false;     // the dataset passed its checks
  bool contiguous = false;  // its bytes lie at `offset` in the file, unfiltered
  uint64_t offset = 0;
  std::string problem_check, problem;
};

// The chunk's size in bytes; 0 when it overflows (the dataset check reports that).
uint64_t ChunkBytes(const DataJob& j) {
  try {
    return static_cast<uint64_t>(
        internal::CheckedMul(j.chunk->box.NumElements(), static_cast<int64_t>(DTypeSize(j.dtype)), *j.key));
  } catch (const Error&) {
    return 0;
  }
}

std::string TensorWhere(const std::string& file, const std::string& key, const ChunkMeta* c) {
  std::string s = file.empty() ? "" : file + ": ";
  s += "tensor '" + key + "'";
  if (c) s += " chunk " + c->box.ToString();
  return s;
}

class Collector {
 public:
  explicit Collector(VerifyReport& r) : r_(r) {}
  void Add(std::string check, std::string file, std::string key, std::string message) {
    r_.problems.push_back({std::move(check), std::move(file), std::move(key), std::move(message)});
  }

 private:
  VerifyReport& r_;
};

// A chunk to check: its key, entry and record (pointers into the metadata or a catalog).
struct Placed {
  const std::string* key;
  const EntryMeta* e;
  const ChunkMeta* chunk;
};
// Checks the datasets and data of `chunks`, all in the files `group` (positions in
// Metadata::files), and files their problems; `meanwhile` runs beside the data threads.
using RunGroup = std::function<void(const std::vector<std::size_t>& group, const std::vector<Placed>& chunks,
                                    const std::function<void()>& meanwhile)>;

Shape ShapeOf(const EntryMeta& e) { return e.kind == EntryKind::kBytes ? Shape{static_cast<int64_t>(e.size)} : e.shape; }

using Locators = std::unordered_map<std::string, std::unique_ptr<grid::CellLocator>>;  // by key, made when first needed
using AddProblem = std::function<void(const std::string& key, std::string message)>;
struct Sum {          // FORMAT.md §3.5: an entry's records' stored_bytes
  uint64_t stored = 0;  // saturating
  int64_t records = 0;
};

// Takes the records of file `file` (`records`, from its index) that its layouts place there
// into `chunks`, adding their stored bytes to `sums`; files the others. Returns how many it took.
int64_t TakeRecords(const Metadata& md, int32_t file, const std::string& name,
                    const std::unordered_map<std::string, std::vector<storage::ShardIndexEntry>>& records,
                    internal::ChunkCatalog& catalog, Locators& locators, std::vector<Placed>& chunks,
                    std::unordered_map<const EntryMeta*, Sum>& sums, const AddProblem& add) {
  auto locator = [&](const std::string& key, const EntryMeta& e) -> const grid::CellLocator& {
    auto& l = locators[key];
    if (!l) l = std::make_unique<grid::CellLocator>(e.layout, ShapeOf(e));
    return *l;
  };
  int64_t found = 0;
  for (const auto& [key, list] : records) {
    const EntryMeta* e = md.Find(key);
    const bool kind_ok = e && (e->kind == EntryKind::kTensor || e->kind == EntryKind::kBytes);
    for (const storage::ShardIndexEntry& rec : list) {
      if (!kind_ok || rec.bytes != (e->kind == EntryKind::kBytes) || locator(key, *e).FileOf(rec.chunk.box) != file) {
        add(key, name + ": its index lists " + std::string(rec.bytes ? "bytes" : "tensor") + " '" + key + "' chunk " +
                     rec.chunk.box.ToString() + " (dataset '" + rec.chunk.dataset +
                     "'), which metadata.json does not place in this file");
        continue;
      }
      try {
        chunks.push_back({&key, e, &catalog.Find(key, *e, rec.chunk.box, file)});
        ++found;
        Sum& sum = sums[e];
        const uint64_t b = chunks.back().chunk->stored_bytes;
        sum.stored = b > UINT64_MAX - sum.stored ? UINT64_MAX : sum.stored + b;
        ++sum.records;
      } catch (const std::exception& err) {
        add(key, err.what());
      }
    }
  }
  return found;
}

// Files a problem for each chunk that the layouts place in file `file` and its index lacks.
void NameMissing(const Metadata& md, int32_t file, internal::ChunkCatalog& catalog, const AddProblem& add) {
  for (const auto& kv : md.entries) {  // (no structured binding: clang 14 cannot capture one)
    const std::string& key = kv.first;
    const EntryMeta& e = kv.second;
    if (e.kind != EntryKind::kTensor && e.kind != EntryKind::kBytes) continue;
    grid::ForEachChunk(e.layout, ShapeOf(e), [&](const Box& box, int32_t f) {
      if (f != file) return;
      try {
        catalog.Find(key, e, box, file);
      } catch (const std::exception& err) {
        add(key, err.what());
      }
    });
  }
}

// Format v2: the chunk records come from the shard indexes, each checked against its
// digest in metadata.json and against the layouts: every record must be a chunk its
// file's layout places there, and every chunk placed there must have its record
// (problems under "index"). Files are taken in groups of about `group_chunks` chunks: a
// group's indexes are read, its records checked, its datasets and data checked through
// `run_group`, and all of it dropped before the next group, so memory is bounded by a
// group (or by the largest file), not by the checkpoint; time is linear in the chunks.
using MakeCatalog = std::function<std::unique_ptr<internal::ChunkCatalog>()>;
void VerifyIndexes(const MakeCatalog& make_catalog, const Metadata& md, const std::vector<char>& usable, int64_t group_chunks,
                   std::vector<VerifyProblem>& problems, const std::function<void()>& meanwhile,
                   const RunGroup& run_group, bool rethrow_io = false) {
  const std::size_t nf = md.files.size();
  std::vector<int64_t> expected(nf, 0);  // chunks the layouts place in each file
  for (const auto& [key, e] : md.entries) {
    if (e.kind != EntryKind::kTensor && e.kind != EntryKind::kBytes) continue;
    grid::ForEachChunk(e.layout, ShapeOf(e), [&](const Box&, int32_t file) { ++expected[static_cast<std::size_t>(file)]; });
  }
  Locators locators;
  int named_missing = 0;  // files whose missing records were named one by one
  std::unordered_map<const EntryMeta*, Sum> sums;
  if (nf == 0) meanwhile();
  for (std::size_t first = 0; first < nf;) {
    std::vector<std::size_t> group;
    int64_t n = 0;
    for (std::size_t fi = first; fi < nf && (group.empty() || n + expected[fi] <= group_chunks); ++fi) {
      group.push_back(fi);
      n += expected[fi];
    }
    const std::unique_ptr<internal::ChunkCatalog> catalog_owner = make_catalog();
    internal::ChunkCatalog& catalog = *catalog_owner;
    std::vector<Placed> chunks;
    for (const std::size_t fi : group) {
      if (!usable[fi]) continue;  // missing, not regular, or listed before: reported under "files"
      const std::string& name = md.files[fi].name;
      const auto file = static_cast<int32_t>(fi);
      const std::unordered_map<std::string, std::vector<storage::ShardIndexEntry>>* records = nullptr;
      try {
        records = &catalog.Records(file);
      } catch (const Error& e) {
        // On object storage a failed request (after its retries) says nothing of the checkpoint.
        if (rethrow_io && (e.code() == ErrorCode::kIO || e.code() == ErrorCode::kChanged)) throw;
        problems.push_back({"index", name, "", e.what()});
        continue;
      } catch (const std::exception& e) {
        problems.push_back({"index", name, "", e.what()});
        continue;
      }
      std::set<std::string> said;  // messages already given for this file
      const AddProblem add = [&](const std::string& key, std::string message) {
        if (said.size() < 40 && said.insert(message).second) problems.push_back({"index", name, key, std::move(message)});
      };
      const int64_t found = TakeRecords(md, file, name, *records, catalog, locators, chunks, sums, add);
      if (found >= expected[fi]) continue;
      if (named_missing++ < 8) {  // name them: the chunks placed here that have no record
        NameMissing(md, file, catalog, add);
      } else {
        add("", name + ": its index holds " + std::to_string(found) + " of the " + std::to_string(expected[fi]) +
                    " chunks metadata.json places in this file");
      }
    }
    run_group(group, chunks, first == 0 ? meanwhile : std::function<void()>([] {}));
    first += group.size();
  }
  // An entry whose records were all found: its stored_bytes is their sum (a missing record
  // is reported above on its own).
  for (const auto& [key, e] : md.entries) {
    if (e.kind != EntryKind::kTensor && e.kind != EntryKind::kBytes) continue;
    const auto it = sums.find(&e);
    if (it == sums.end() || it->second.records != grid::ChunkCount(e.layout, ShapeOf(e))) continue;
    try {
      internal::CheckStoredBytes(key, e, it->second.stored);
    } catch (const Error& err) {
      problems.push_back({"index", names::kMetadataFile, key, err.what()});
    }
  }
}

// Reading the data. The calling thread checks every dataset's HDF5 header file by file
// (ShardReader::Locate; HDF5 serialises these behind its global lock, so one thread does
// them all), largest chunks first, and hands the checked chunks to the data threads in
// batches, each batch in file order; the data threads hash them meanwhile. Contiguous
// chunks are hashed from the page cache (storage::FileHasher); filtered ones are read through
// HDF5 in blocks.
struct FileWork {
  std::string name;
  std::vector<std::size_t> jobs;  // indices into the job list
  uint64_t bytes = 0;             // data bytes to read
  // Filled by the checking thread; read by the data threads up to `published`.
  std::vector<std::size_t> order;     // chunks to read, batch after batch
  std::atomic<std::size_t> published{0};
  std::atomic<std::size_t> next{0};   // next entry of `order` to read
  std::atomic<bool> checked{false};   // all of `order` is published
  std::string open_problem;           // not readable HDF5
  std::vector<std::string> link_problems;  // links no chunk names that are not datasets of its own
  std::vector<std::pair<std::string, std::string>> pack_problems;  // (key, message): packs not tiled by their members

  // Claims the next published chunk; false when there is none now.
  bool Claim(std::size_t& i) {
    i = next.load();
    while (i < published.load())
      if (next.compare_exchange_weak(i, i + 1)) return true;
    return false;
  }
  std::size_t Left() const {
    const std::size_t p = published.load(), n = next.load();
    return p > n ? p - n : 0;
  }
};

// What one thread keeps open per file.
struct OpenFile {
  std::unique_ptr<storage::ShardReader> reader;
  std::unique_ptr<storage::FileHasher> hasher;
};

class DataRun {
 public:
  DataRun(const storage::Dir& dir, std::vector<DataJob>& jobs, std::vector<std::unique_ptr<FileWork>>& files)
      : dir_(dir), jobs_(jobs), files_(files) {}

  // On the calling thread: checks every file's datasets, largest file first, handing
  // their chunks to the data threads as it goes. `progress` is called now and then.
  void LocateAll(const std::function<void()>& progress) {
    std::vector<std::size_t> order(files_.size());
    for (std::size_t f = 0; f < order.size(); ++f) order[f] = f;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return files_[a]->bytes > files_[b]->bytes; });
    std::vector<char> whole(files_.size(), 0);  // prefetched whole
    for (std::size_t i = 0; i < order.size(); ++i) {
      // The dataset headers lie all over the file: from a cold disk, checking them is many
      // small reads unless the file is already on its way (and the next file after it).
      if (i == 0) whole[order[0]] = Prefetch(*files_[order[0]]);
      if (i + 1 < order.size()) whole[order[i + 1]] = Prefetch(*files_[order[i + 1]]);
      Locate(*files_[order[i]], whole[order[i]], progress);
    }
  }

  // Lets the data threads finish when the checking thread fails.
  void Abandon() {
    {
      std::lock_guard lock(mu_);
      for (auto& f : files_) f->checked = true;
    }
    cv_.notify_all();
  }

  // A data thread: hashes published chunks until all files are checked and read.
  void Worker() {
    std::vector<OpenFile> open(files_.size());
    std::vector<unsigned char> buf;
    for (long f; (f = Next()) >= 0;) {
      FileWork& fw = *files_[f];
      for (std::size_t i; fw.Claim(i);) Hash(jobs_[fw.order[i]], fw, open[f], buf);
      if (fw.checked && fw.Left() == 0) open[f] = OpenFile();  // done with it
    }
  }

  std::atomic<uint64_t> done{0};

 private:
  static constexpr uint64_t kBatch = uint64_t{64} << 20;  // handed over at a time

  // Asks the kernel to read the whole file into the page cache in the background when it
  // is small enough to stay there until it is hashed (returns true), else its beginning
  // (the data threads' FileHasher then asks for more ahead of what they hash). Nothing
  // when no data of the file is to be read.
  bool Prefetch(const FileWork& fw) { return fw.bytes != 0 && storage::PrefetchFile(dir_, fw.name); }

  // A file with published chunks left to read (the one with most left), waiting for the
  // checking thread when there is none yet; -1 when all is done.
  long Next() {
    std::unique_lock lock(mu_);
    for (;;) {
      long best = -1;
      std::size_t most = 0;
      bool all_checked = true;
      for (std::size_t f = 0; f < files_.size(); ++f) {
        all_checked = all_checked && files_[f]->checked;
        if (const std::size_t left = files_[f]->Left(); left > most) {
          most = left;
          best = static_cast<long>(f);
        }
      }
      if (best >= 0 || all_checked) return best;
      cv_.wait(lock);
    }
  }

  void Publish(FileWork& fw, std::vector<std::pair<uint64_t, std::size_t>>& batch, bool last) {
    std::sort(batch.begin(), batch.end());
    {
      std::lock_guard lock(mu_);
      for (const auto& b : batch) fw.order.push_back(b.second);  // capacity reserved: no reallocation
      fw.published.store(fw.order.size());
      fw.checked = last;
    }
    cv_.notify_all();
    batch.clear();
  }

  // Checks every dataset of the file against metadata, largest chunks first, publishing
  // the chunks to read in batches of up to kBatch bytes, each in file order (filtered
  // chunks last); in one batch when the file is not prefetched whole, so that it is read
  // front to back from a cold disk.
  void Locate(FileWork& fw, bool batches, const std::function<void()>& progress) {
    std::vector<std::pair<uint64_t, std::size_t>> batch, filtered;
    fw.order.reserve(fw.jobs.size());
    OpenFile of;
    try {
      of.reader = std::make_unique<storage::ShardReader>(dir_, fw.name, /*use_index=*/false, /*evict_on_close=*/true);
    } catch (const std::exception& e) {
      fw.open_problem = e.what();
      Publish(fw, batch, true);
      return;
    }
    // One pass over the root's links (FORMAT.md §5.6): links not the shard's own datasets,
    // objects no record names, and where each named dataset is, so that each is then opened
    // by its address rather than by two more walks of the link index (issue 32.6).
    constexpr uint64_t kUnseen = ~uint64_t{0};
    std::unordered_map<std::string_view, uint64_t> address;  // dataset name -> its object
    address.reserve(fw.jobs.size());
    for (const std::size_t i : fw.jobs) address.emplace(jobs_[i].chunk->dataset, kUnseen);
    std::vector<std::string> unnamed;
    const auto links = of.reader->ScanRoot(
        [&](const char* name, uint64_t at) {
          if (auto it = address.find(name); it != address.end()) it->second = at;
          else if (unnamed.size() < 20) unnamed.emplace_back(name);
        },
        100);
    for (auto& [name, message] : links)  // those chunks name are reported below
      if (!address.count(name)) fw.link_problems.push_back(std::move(message));
    for (const std::string& name : unnamed) {
      fw.link_problems.push_back(fw.name + ": '" + name +
                                 "' is an object no record names (a shard holds only its chunks' datasets and "
                                 "packs, FORMAT.md §5.6)");
    }
    std::vector<std::pair<uint64_t, std::size_t>> by_size;
    for (const std::size_t i : fw.jobs) by_size.emplace_back(ChunkBytes(jobs_[i]), i);
    std::stable_sort(by_size.begin(), by_size.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    // At least four batches a file (so the data threads start early on small files too).
    const uint64_t batch_limit = std::max<uint64_t>(1, std::min(kBatch, fw.bytes / 4));
    uint64_t batch_bytes = 0;
    for (const auto& [bytes, i] : by_size) {
      DataJob& job = jobs_[i];
      try {
        // The dataset's own HDF5 header, even where a v2 index gives the offset: an
        // independent reader (h5py) goes by the header, so the two must agree.
        const auto found = address.find(job.chunk->dataset);
        const uint64_t* where = found != address.end() && found->second != kUnseen ? &found->second : nullptr;
        const auto at = of.reader->Locate(*job.key, job.dtype, *job.chunk, /*by_header=*/true, where);
        if (at) {
          job.contiguous = true;
          job.offset = *at;
        }
        if (job.chunk->offset && ChunkBytes(job) > 0 && (!at || *at != *job.chunk->offset)) {
          job.problem_check = "datasets";
          job.problem = TensorWhere(fw.name, *job.key, job.chunk) + " (dataset '" + job.chunk->dataset +
                        "'): the shard index places its data at byte " + std::to_string(*job.chunk->offset) +
                        (at ? ", its HDF5 header at byte " + std::to_string(*at) : ", its HDF5 header stores it filtered");
          continue;
        }
        // FORMAT.md §5.4: an uncompressed dataset with data is contiguous.
        if (!at && ChunkBytes(job) > 0 && job.chunk->compression.codec == Compression::Codec::kNone) {
          job.problem_check = "datasets";
          job.problem = TensorWhere(fw.name, *job.key, job.chunk) + " (dataset '" + job.chunk->dataset +
                        "'): its record says uncompressed, its HDF5 header stores it chunked or filtered "
                        "(uncompressed datasets are contiguous, FORMAT.md §5.4)";
          continue;
        }
        // FORMAT.md §5.5: a v2 record (one with block digests) gives `offset` exactly for a
        // contiguous dataset with data.
        if (job.chunk->block_bytes != 0 && job.chunk->offset.has_value() != (at && ChunkBytes(job) > 0)) {
          job.problem_check = "index";
          job.problem = TensorWhere(fw.name, *job.key, job.chunk) + " (dataset '" + job.chunk->dataset + "'): " +
                        (job.chunk->offset ? "the shard index gives an offset for a dataset with no data"
                                           : "the shard index gives no offset for a contiguous dataset with data");
          continue;
        }
      } catch (const std::exception& e) {
        job.problem_check = "datasets";  // missing dataset, wrong dtype or extent, data past the end
        job.problem = e.what();
        continue;
      }
      job.located = true;
      if (!job.hash && !job.finite) continue;
      if (!job.contiguous) {
        filtered.emplace_back(filtered.size(), i);
        continue;
      }
      batch.emplace_back(job.offset, i);
      batch_bytes += bytes;
      if (batches && batch_bytes >= batch_limit) {
        Publish(fw, batch, false);
        batch_bytes = 0;
        progress();
      }
    }
    Publish(fw, batch, false);
    Publish(fw, filtered, true);
    CheckPacks(fw, *of.reader);
    progress();
  }

  // FORMAT.md §5.7: the members of each pack, as the index places them, tile its extent in
  // the HDF5 header exactly: from byte 0, back to back, to its end. (Overlaps are refused
  // by the index parser already; chunks whose own place failed are reported by Locate.)
  void CheckPacks(FileWork& fw, storage::ShardReader& reader) {
    std::map<std::string, std::vector<std::pair<uint64_t, std::size_t>>> packs;  // name -> (pack_offset, job)
    for (const std::size_t i : fw.jobs)
      if (jobs_[i].chunk->pack_offset) packs[jobs_[i].chunk->dataset].emplace_back(*jobs_[i].chunk->pack_offset, i);
    for (auto& [name, members] : packs) {
      std::sort(members.begin(), members.end());
      const DataJob& first = jobs_[members.front().second];
      const std::string where = fw.name + ": pack '" + name + "'";
      storage::ShardReader::PackExtent extent;
      try {
        extent = reader.Pack(name, where);
      } catch (const std::exception& e) {
        fw.pack_problems.emplace_back(*first.key, e.what());
        continue;
      }
      uint64_t end = 0;
      for (const auto& [at, i] : members) {
        if (at != end) {
          fw.pack_problems.emplace_back(*jobs_[i].key, where + ": tensor '" + *jobs_[i].key + "' chunk " +
                                                          jobs_[i].chunk->box.ToString() + " starts at byte " +
                                                          std::to_string(at) + " of the pack, its members before it end at byte " +
                                                          std::to_string(end));
        }
        end = std::max(end, at + ChunkBytes(jobs_[i]));
      }
      if (end != extent.bytes) {
        fw.pack_problems.emplace_back(*first.key, where + ": its members cover " + std::to_string(end) +
                                                     " bytes, its HDF5 header gives it " +
                                                     std::to_string(extent.bytes));
      }
    }
  }

  void Hash(DataJob& job, const FileWork& fw, OpenFile& of, std::vector<unsigned char>& buf) {
    try {
      const std::size_t item = DTypeSize(job.dtype);
      const uint64_t bytes = static_cast<uint64_t>(job.chunk->box.NumElements()) * item;  // checked by Locate
      storage::Digest digest(job.dtype, job.finite, job.chunk->block_bytes);
      if (bytes == 0) {
        // nothing to read: the checksum of no bytes
      } else if (job.contiguous) {
        if (!of.hasher) of.hasher = std::make_unique<storage::FileHasher>(dir_, fw.name);
        of.hasher->Hash(job.offset, bytes, digest, [this](uint64_t n) { done.fetch_add(n); },
                        TensorWhere(fw.name, *job.key, job.chunk));
      } else {
        if (!of.reader)  // (evicting as the checking thread's reader of the file does: HDF5 refuses a mix)
          of.reader = std::make_unique<storage::ShardReader>(dir_, fw.name, /*use_index=*/false, /*evict_on_close=*/true);
        for (const Box& block : SplitBox(job.chunk->box, item, kBlockBytes)) {
          const auto n = static_cast<std::size_t>(block.NumElements()) * item;
          buf.resize(std::max<std::size_t>(n, 8));
          of.reader->Read(*job.key, job.dtype, *job.chunk, block, buf.data(), block, /*verify=*/false);
          digest.Update(buf.data(), n);
          done.fetch_add(n);
        }
      }
      std::string mismatch;
      if (job.hash) {
        try {
          storage::CheckDigest(digest, *job.chunk, bytes, TensorWhere(job.file(), *job.key, job.chunk));
        } catch (const Error& e) {
          mismatch = e.what();
        }
      }
      if (!mismatch.empty()) {
        job.problem_check = "checksums";
        job.problem = mismatch;
      } else if (job.finite) {
        const auto stats = digest.Stats();
        if (stats && (stats->nan_count || stats->inf_count)) {
          job.problem_check = "finite";
          job.problem = TensorWhere(job.file(), *job.key, job.chunk) + ": " + std::to_string(stats->nan_count) +
                        " NaN and " + std::to_string(stats->inf_count) + " Inf elements";
        }
      }
    } catch (const std::exception& e) {
      job.problem_check = "datasets";  // a short read, an I/O error
      job.problem = e.what();
    }
  }

  const storage::Dir& dir_;  // every file opened through it: the checkpoint pinned (FORMAT.md §2.7)
  std::vector<DataJob>& jobs_;
  std::vector<std::unique_ptr<FileWork>>& files_;
  std::mutex mu_;
  std::condition_variable cv_;
};

// Starts `threads` data threads, runs `meanwhile` and then the dataset checks on the
// calling thread, and shows progress until the data threads are done. Returns the bytes read.
uint64_t RunDataJobs(const storage::Dir& dir, std::vector<DataJob>& jobs, std::vector<std::unique_ptr<FileWork>>& files,
                     int threads, const std::function<void(uint64_t, uint64_t)>& progress,
                     const std::function<void()>& meanwhile) {
  uint64_t total = 0;
  for (const auto& f : files) total += f->bytes;
  DataRun run(dir, jobs, files);
  std::mutex mu;
  std::condition_variable finished;
  int running = threads;
  auto pool = storage::SpawnThreads(static_cast<std::size_t>(threads), [&](std::size_t) {
    run.Worker();
    std::lock_guard lock(mu);
    if (--running == 0) finished.notify_all();
  });
  {
    std::lock_guard lock(mu);
    running -= threads - static_cast<int>(pool.size());  // those the system did not start
  }
  auto show = [&] {
    if (progress) progress(run.done.load(), total);
  };
  try {
    meanwhile();
    run.LocateAll(show);
    if (threads > 0 && pool.empty()) run.Worker();  // no data thread started: this one hashes it all
  } catch (...) {
    run.Abandon();
    for (auto& t : pool) t.join();
    throw;
  }
  {
    std::unique_lock lock(mu);
    while (!finished.wait_for(lock, std::chrono::milliseconds(100), [&] { return running == 0; })) show();
  }
  for (auto& t : pool) t.join();
  show();
  return run.done.load();
}

// Opens the checkpoint directory `path` pinned (FORMAT.md §2.7) and reads its metadata.json
// through the handle into `text`: metadata.json and every file are then opened through
// one handle on the directory, so a verify racing an overwrite judges one checkpoint,
// never a mix. False (the problem filed) when there is no metadata.json to read.
bool PinAndRead(const fs::path& path, storage::Dir& dir, std::string& text, Collector& c) {
  for (int attempt = 1;; ++attempt) {
    try {
      dir = storage::Dir::Open(path);
      // As every reader does: a regular file in the checkpoint (no symlink, FIFO, device), within the size limit.
      text = storage::ReadFileLimitedAt(dir, kMetadataFileName, ParseLimits{}.max_bytes);
      return true;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kChanged && attempt < 4) continue;  // replaced before it was read: the new one
      if (e.code() == ErrorCode::kChanged || (e.code() == ErrorCode::kNotFound && !dir)) throw;
      c.Add("metadata", kMetadataFileName, "",
            e.code() == ErrorCode::kNotFound
                ? path.string() + ": no metadata.json: not a committed checkpoint (an interrupted save?)"
                : std::string(e.what()));
      return false;
    }
  }
}

// Verifying a checkpoint directory whose metadata.json parsed: its files, shard indexes,
// tiling, datasets and data, the problems kept apart by kind until Finish() files them
// in report order (index, then per file, then tiling, then per chunk).
class DirectoryCheck {
 public:
  DirectoryCheck(const storage::Dir& dir, const Metadata& md, const CheckOptions& o, VerifyReport& r)
      : dir_(dir), md_(md), o_(o), r_(r), file_problems_(md.files.size()), usable_(md.files.size(), 0) {
    // Data threads: no more than the cores; none when no data is read (the dataset checks
    // run on this thread: HDF5's lock serialises them anyway).
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    threads_ = std::min<int>(std::max(1, o.threads), static_cast<int>(cores));
    if (o.quick && !o.check_finite) threads_ = 0;  // no data to read
  }

  // files: present, regular, of the recorded size (each is opened as HDF5 when its
  // datasets are checked, below). A name listed twice is checked once.
  void CheckFiles() {
    std::set<std::string> names_seen;
    for (std::size_t fi = 0; fi < md_.files.size(); ++fi) {
      const auto& f = md_.files[fi];
      auto add = [&](std::string message) { file_problems_[fi].push_back({"files", f.name, "", std::move(message)}); };
      if (!IsSafeFileName(f.name)) {
        add("file name '" + f.name + "' escapes the checkpoint directory");
        continue;
      }
      struct stat sb;
      if (::fstatat(dir_.fd(), f.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        add(f.name + ": missing (listed in metadata.json for rank " + std::to_string(f.rank) + ")");
        continue;
      }
      if (!S_ISREG(sb.st_mode)) {
        add(f.name + ": not a regular file (symlinks and devices are refused)");
        continue;
      }
      if (static_cast<uint64_t>(sb.st_size) != f.bytes)
        add(f.name + ": size is " + std::to_string(sb.st_size) + " bytes, metadata says " + std::to_string(f.bytes) +
            (static_cast<uint64_t>(sb.st_size) < f.bytes ? " (truncated?)" : ""));
      if (names_seen.insert(f.name).second) usable_[fi] = 1;
    }
  }

  // The chunks, file group by file group: v1 (resolved) all at once from the metadata, v2
  // from the shard indexes (VerifyIndexes); the tiling is checked meanwhile.
  void CheckChunks() {
    const bool v2 = !md_.resolved;
    auto check_tiling = [&] {
      for (const auto& [key, e] : md_.entries)
        for (auto& msg : internal::EntryTilingProblems(key, e, !v2)) tiling_.emplace_back(key, std::move(msg));
    };
    auto run_group = [&](const std::vector<std::size_t>& group, const std::vector<Placed>& chunks,
                         const std::function<void()>& meanwhile) { RunGroup(group, chunks, meanwhile); };
    if (v2) {
      const std::shared_ptr<const Metadata> shared(&md_, [](const Metadata*) {});  // outlives every catalog
      const MakeCatalog make_catalog = [&] { return std::make_unique<internal::ChunkCatalog>(dir_, shared); };
      VerifyIndexes(make_catalog, md_, usable_, o_.group_chunks, index_problems_, check_tiling, run_group);
      return;
    }
    std::vector<std::size_t> all(md_.files.size());
    for (std::size_t fi = 0; fi < all.size(); ++fi) all[fi] = fi;
    std::vector<Placed> chunks;
    for (const auto& [key, e] : md_.entries) {
      if (e.kind == EntryKind::kScalar || e.kind == EntryKind::kJson) continue;
      for (const auto& chunk : e.chunks) chunks.push_back({&key, &e, &chunk});
    }
    RunGroup(all, chunks, check_tiling);
  }

  void Finish(Collector& c) {
    for (auto& p : index_problems_) r_.problems.push_back(std::move(p));
    for (auto& p : per_file_) r_.problems.push_back(std::move(p));
    for (auto& [key, msg] : tiling_) c.Add("tiling", "", key, std::move(msg));
    for (auto& p : per_chunk_) r_.problems.push_back(std::move(p));
  }

 private:
  // The data jobs of `chunks` (the files worth opening listed in `files`, by name in `file_index`).
  std::vector<DataJob> MakeJobs(const std::vector<Placed>& chunks, const std::map<std::string, std::size_t>& file_index,
                                std::vector<std::unique_ptr<FileWork>>& files) {
    std::vector<DataJob> jobs;
    jobs.reserve(chunks.size());
    for (const Placed& pc : chunks) {
      const ChunkMeta& chunk = *pc.chunk;
      ++r_.chunks;
      const auto fit = file_index.find(chunk.file);
      if (fit == file_index.end()) continue;  // already reported under "files"
      DataJob job;
      job.key = pc.key;
      job.dtype = pc.e->dtype;
      job.chunk = &chunk;  // a bytes entry: uint8, its box the 1-D extent (as parsed)
      const bool floating = pc.e->kind == EntryKind::kTensor && IsFloating(pc.e->dtype);
      job.finite = o_.check_finite && floating && !(o_.quick && chunk.stats);  // quick: trust recorded stats
      job.recorded_nonfinite = o_.check_finite && floating && o_.quick && chunk.stats &&
                               (chunk.stats->nan_count || chunk.stats->inf_count);
      job.hash = !o_.quick;
      FileWork& fw = *files[fit->second];
      if (job.hash || job.finite) fw.bytes += ChunkBytes(job);
      fw.jobs.push_back(jobs.size());
      jobs.push_back(std::move(job));
    }
    return jobs;
  }

  // Files the problems of the files of `group`, now that their datasets were checked.
  void FileProblems(const std::vector<std::size_t>& group, const std::map<std::string, std::size_t>& file_index,
                    std::vector<std::unique_ptr<FileWork>>& files) {
    for (const std::size_t fi : group) {
      for (auto& p : file_problems_[fi]) per_file_.push_back(std::move(p));
      file_problems_[fi].clear();
      const auto it = file_index.find(md_.files[fi].name);
      if (it == file_index.end()) continue;
      FileWork& fw = *files[it->second];
      if (!fw.open_problem.empty()) {
        // A file that does not open failed its index's resolution the same way: once, here.
        std::erase_if(index_problems_, [&](const VerifyProblem& p) {
          return p.check == "index" && p.file == fw.name && p.message == fw.open_problem;
        });
        per_file_.push_back({"files", fw.name, "", fw.open_problem});
        fw.open_problem.clear();
      }
      for (auto& p : fw.link_problems) per_file_.push_back({"datasets", fw.name, "", std::move(p)});
      fw.link_problems.clear();
      for (auto& [key, p] : fw.pack_problems) per_file_.push_back({"datasets", fw.name, key, std::move(p)});
      fw.pack_problems.clear();
    }
  }

  // Checks the datasets, checksums and finiteness of `chunks` (key, entry, chunk), all in
  // the files `group`, and files those files' problems; `meanwhile` runs beside the data.
  void RunGroup(const std::vector<std::size_t>& group, const std::vector<Placed>& chunks,
                const std::function<void()>& meanwhile) {
    std::map<std::string, std::size_t> file_index;  // files worth opening
    std::vector<std::unique_ptr<FileWork>> files;
    for (const std::size_t fi : group) {
      if (!usable_[fi]) continue;
      file_index.emplace(md_.files[fi].name, files.size());
      files.push_back(std::make_unique<FileWork>());
      files.back()->name = md_.files[fi].name;
    }
    std::vector<DataJob> jobs = MakeJobs(chunks, file_index, files);
    r_.bytes_read += RunDataJobs(dir_, jobs, files, threads_, o_.progress, meanwhile);
    FileProblems(group, file_index, files);
    for (const auto& j : jobs) {
      if (!j.problem.empty()) {
        per_chunk_.push_back({j.problem_check, j.file(), *j.key, j.problem});
      } else if (j.located && j.recorded_nonfinite) {
        per_chunk_.push_back({"finite", j.file(), *j.key,
                              TensorWhere(j.file(), *j.key, j.chunk) + ": " + std::to_string(j.chunk->stats->nan_count) +
                                  " NaN and " + std::to_string(j.chunk->stats->inf_count) +
                                  " Inf elements (recorded statistics)"});
      }
    }
  }

  const storage::Dir& dir_;
  const Metadata& md_;
  const CheckOptions& o_;
  VerifyReport& r_;
  int threads_ = 0;
  std::vector<std::vector<VerifyProblem>> file_problems_;  // "files" problems, by position in md.files
  std::vector<char> usable_;                               // files worth opening
  std::vector<VerifyProblem> index_problems_, per_file_, per_chunk_;
  std::vector<std::pair<std::string, std::string>> tiling_;  // key, message
};

// ---- A checkpoint on object storage (s3://bucket/prefix/step) ----------------------------
// "Ranged" mode: what can be checked without a local file, through the ranged reader
// (checkpoint/object_read.h): metadata.json (digest, schema), each object's size (a HEAD)
// and shard index (a ranged GET, its digest, its records against the layouts), the tiling,
// and unless `quick` every chunk's checksum and every block's digest, the blocks fetched by
// ranged GETs. The HDF5 object headers and stray datasets are local-only checks.

constexpr uint64_t kObjectSliceBytes = uint64_t{32} << 20;  // a chunk is fetched this much at a time

// The text of metadata.json on the store now (kNotFound when none is committed).
std::string FetchMetadataText(const internal::ObjectSource& src) {
  const std::string key = src.prefix.empty() ? kMetadataFileName : src.prefix + "/" + kMetadataFileName;
  const std::vector<std::byte> body = src.store->Get(src.bucket, key, ParseLimits{}.max_bytes);
  return std::string(reinterpret_cast<const char*>(body.data()), body.size());
}

// Reads chunk `pc` by ranged GETs, every block checked against its digest, a slice of rows at
// a time; a chunk found corrupt is filed under "checksums" naming the object, key, chunk and
// block. Returns the bytes fetched.
uint64_t CheckObjectChunk(const internal::ObjectSource& src, const Placed& pc, std::vector<unsigned char>& buf,
                          std::vector<VerifyProblem>& problems) {
  const ChunkMeta& ch = *pc.chunk;
  const DType dtype = pc.e->kind == EntryKind::kBytes ? DType::kUInt8 : pc.e->dtype;
  const std::size_t item = DTypeSize(dtype);
  try {
    const auto n = static_cast<uint64_t>(internal::CheckedMul(ch.box.NumElements(), static_cast<int64_t>(item), *pc.key));
    if (ch.box.sizes.empty() || n <= kObjectSliceBytes) {
      buf.resize(static_cast<std::size_t>(n));
      return internal::ReadObjectPart(src, *pc.key, dtype, ch, ch.box, buf.data(), ch.box, true);
    }
    // Read whole, ReadObjectPart checks the chunk's checksum against its block digests; read
    // in slices, that is checked here.
    if (storage::ChecksumOfBlocks(ch.blocks) != ch.checksum) {
      throw Error(ErrorCode::kCorrupt, src.url + "/" + ch.file + ": tensor '" + *pc.key + "' chunk " + ch.box.ToString() +
                                           ": checksum mismatch: the index says " + ch.checksum +
                                           ", the block digests hash to " + storage::ChecksumOfBlocks(ch.blocks));
    }
    uint64_t fetched = 0;
    const int64_t extent = ch.box.sizes[0];
    const uint64_t row = n / static_cast<uint64_t>(extent);
    const auto rows = static_cast<int64_t>(std::max<uint64_t>(1, kObjectSliceBytes / std::max<uint64_t>(1, row)));
    for (int64_t first = 0; first < extent; first += rows) {
      Box part = ch.box;
      part.offsets[0] += first;
      part.sizes[0] = std::min(rows, extent - first);
      buf.resize(static_cast<std::size_t>(static_cast<uint64_t>(part.sizes[0]) * row));
      fetched += internal::ReadObjectPart(src, *pc.key, dtype, ch, part, buf.data(), part, true);
    }
    return fetched;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorrupt && e.code() != ErrorCode::kMismatch) throw;  // I/O: no verdict
    problems.push_back({"checksums", ch.file, *pc.key, e.what()});
    return 0;
  }
}

// Checks the data of `chunks` on up to `threads` threads (each chunk's blocks fetched 8 at
// a time besides), its problems in chunk order; a failed request stops them all and is rethrown.
uint64_t CheckObjectChunks(const internal::ObjectSource& src, const std::vector<Placed>& chunks, int threads,
                           std::vector<VerifyProblem>& problems) {
  if (chunks.empty()) return 0;
  const std::size_t nt = std::min<std::size_t>(static_cast<std::size_t>(std::max(1, threads)), chunks.size());
  std::vector<std::vector<std::pair<std::size_t, VerifyProblem>>> found(nt);
  std::vector<uint64_t> fetched(nt, 0);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&](std::size_t t) {
    std::vector<unsigned char> buf;
    std::vector<VerifyProblem> mine;
    try {
      for (std::size_t i; !stop && (i = next.fetch_add(1)) < chunks.size();) {
        fetched[t] += CheckObjectChunk(src, chunks[i], buf, mine);
        for (auto& p : mine) found[t].emplace_back(i, std::move(p));
        mine.clear();
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
      stop = true;
    }
  };
  {
    const auto pool = storage::SpawnThreads(nt - 1, [&](std::size_t t) { work(t + 1); });
    work(0);
  }
  if (error) std::rethrow_exception(error);
  std::vector<std::pair<std::size_t, VerifyProblem>> all;
  for (auto& f : found) std::move(f.begin(), f.end(), std::back_inserter(all));
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [i, p] : all) problems.push_back(std::move(p));
  uint64_t total = 0;
  for (const uint64_t b : fetched) total += b;
  return total;
}

// Returns false, having checked nothing, for a checkpoint that ranged reads cannot check
// (VerifyDownloaded then does).
bool VerifyObject(const std::string& url, const CheckOptions& o, VerifyReport& r, Collector& c) {
  r.mode = "ranged";
  uint64_t seen = 0;
  std::shared_ptr<const internal::ObjectSource> src;
  try {
    src = internal::OpenObjectSource(url, o.s3, &seen);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kUnsupported) return false;  // format version 1
    if (e.code() != ErrorCode::kCorrupt) throw;  // missing, unreachable: 2
    c.Add("metadata", kMetadataFileName, "", e.what());  // unparsable, or its digest does not match
    return true;
  }
  const Metadata& md = *src->metadata;
  if (!internal::ReadableByRanges(md)) return false;
  r.format_version = md.format_version;
  r.keys = md.entries.size();
  r.files = md.files.size();
  // The schema is checked on the text read again; a different text is another checkpoint.
  auto changed = [&] { return std::hash<std::string>{}(FetchMetadataText(*src)) != seen; };
  const std::string text = FetchMetadataText(*src);
  if (std::hash<std::string>{}(text) != seen)
    throw Error(ErrorCode::kChanged, src->url + ": metadata.json changed while it was read (run again)");
  if (o.check_text)
    for (auto& p : o.check_text(text)) r.problems.push_back(std::move(p));
  std::vector<char> usable(md.files.size(), 0);
  std::set<std::string> names_seen;
  for (std::size_t fi = 0; fi < md.files.size(); ++fi) usable[fi] = names_seen.insert(md.files[fi].name).second;
  std::vector<VerifyProblem> index_problems, chunk_problems;
  std::vector<std::pair<std::string, std::string>> tiling;
  auto check_tiling = [&] {
    for (const auto& [key, e] : md.entries)
      for (auto& msg : internal::EntryTilingProblems(key, e, false)) tiling.emplace_back(key, std::move(msg));
  };
  const RunGroup run_group = [&](const std::vector<std::size_t>&, const std::vector<Placed>& chunks,
                                 const std::function<void()>& meanwhile) {
    meanwhile();
    r.chunks += chunks.size();
    if (!o.quick) r.bytes_read += CheckObjectChunks(*src, chunks, o.threads, chunk_problems);
  };
  const MakeCatalog make_catalog = [&] { return std::make_unique<internal::ChunkCatalog>(src); };
  VerifyIndexes(make_catalog, md, usable, o.group_chunks, index_problems, check_tiling, run_group, true);
  for (auto& p : index_problems) r.problems.push_back(std::move(p));
  for (auto& [key, msg] : tiling) c.Add("tiling", "", key, std::move(msg));
  for (auto& p : chunk_problems) r.problems.push_back(std::move(p));
  if (o.check_metadata)
    for (auto& p : o.check_metadata(md)) r.problems.push_back(std::move(p));
  // As on disk: problems found in a checkpoint replaced meanwhile may be only its objects removed.
  if (!r.ok()) {
    bool replaced = false;
    try {
      replaced = changed();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound) throw;
      replaced = true;
    }
    if (replaced)
      throw Error(ErrorCode::kChanged, src->url + ": verify found " + std::to_string(r.problems.size()) +
                                           " problem(s) in it, but its metadata.json changed meanwhile (run again)");
  }
  return true;
}

// Every check of a local checkpoint directory (the pinned one at `path`).
void VerifyLocal(const fs::path& path, const CheckOptions& o, VerifyReport& r, Collector& c) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(ErrorCode::kNotFound, path.string() + ": no such file or directory");
  storage::Dir dir;
  std::string text;
  if (!PinAndRead(path, dir, text, c)) return;
  // The caller's check of the text runs on a thread of its own while the metadata is parsed
  // and the data read (it only reports, nothing waits on it).
  std::vector<VerifyProblem> text_problems;
  auto text_check = storage::AsyncOrDeferred([&] {
    if (o.check_text) text_problems = o.check_text(text);
  });
  auto add_text_problems = [&] {
    text_check.get();  // rethrows what the caller's check threw
    r.problems.insert(r.problems.begin(), text_problems.begin(), text_problems.end());
  };
  Metadata md;
  try {
    md = ParseMetadata(text, kMetadataFileName);
  } catch (const Error& e) {
    c.Add("metadata", kMetadataFileName, "", e.what());
    add_text_problems();
    return;
  }
  r.format_version = md.format_version;
  md.BuildIndex();
  r.keys = md.entries.size();
  r.files = md.files.size();
  DirectoryCheck check(dir, md, o, r);
  check.CheckFiles();
  check.CheckChunks();
  check.Finish(c);
  add_text_problems();
  if (o.check_metadata)
    for (auto& p : o.check_metadata(md)) r.problems.push_back(std::move(p));
  // A verdict is of the checkpoint pinned; where problems were found and the path holds
  // another checkpoint now (or none), they may be only files that the replacing commit
  // removed meanwhile: no damage to report, kChanged instead.
  if (!r.ok() && dir.Replaced())
    dir.ThrowChanged("verify found " + std::to_string(r.problems.size()) +
                     " problem(s) in it, which may only be files removed meanwhile");
}

// "Downloaded" mode: an s3:// checkpoint that ranged reads cannot check (format v1, compressed
// chunks, no files[].index_offset), or asked with check_finite: its committed version is
// fetched into a locked local cache directory (as Load's interim path does: bounded by
// CheckOptions::s3.cache_max_bytes, refused before a byte is fetched above it; a replace
// committed meanwhile is kChanged) and every local check runs on it; the cache goes after.
void VerifyDownloaded(const std::string& url, const CheckOptions& o, VerifyReport& r, Collector& c) {
  r.mode = "downloaded";
  const std::unique_ptr<internal::CacheDir> cache = internal::DownloadToCache(url, o.s3, 0);
  VerifyLocal(cache->path(), o, r, c);
  // Problems name files by their names in the checkpoint, not the cache's path.
  const std::string local = cache->path().string();
  for (VerifyProblem& p : r.problems) {
    for (std::string* text : {&p.file, &p.message}) {
      for (std::size_t at; (at = text->find(local)) != std::string::npos;) text->replace(at, local.size(), url);
    }
  }
}

}  // namespace

VerifyReport VerifyCheckpoint(const fs::path& path, const CheckOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  VerifyReport r;
  r.path = path.string();
  r.quick = o.quick;
  Collector c(r);
  if (!internal::IsObjectUrl(path)) {
    VerifyLocal(path, o, r, c);
  } else if (o.check_finite || !VerifyObject(path.string(), o, r, c)) {
    VerifyDownloaded(path.string(), o, r, c);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace ckpt
