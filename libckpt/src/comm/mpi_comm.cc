// comm/mpi_comm.cc: Comm over MPI. Byte buffers go through MPI_Gatherv / MPI_Bcast with
// their sizes exchanged first; tensor collectives map to MPI_Allreduce, MPI_Reduce_scatter_block
// and MPI_Allgather.
// The C API only: the deprecated C++ bindings would need another library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "ckpt/error.h"
#include "ckpt/mpi.h"

namespace ckpt {
namespace {

void Check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(ErrorCode::kComm, std::string(what) + ": " + std::string(msg, static_cast<std::size_t>(len)));
  }
}

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kInt16: return MPI_INT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op MpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are int: larger transfers go in pieces.
constexpr std::size_t kMaxCount = std::size_t{1} << 30;

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Barrier() override { Check(MPI_Barrier(comm_), "MPI_Barrier"); }

  std::vector<ByteBuffer> Gather(std::span<const uint8_t> mine, int root) override {
    const long long n = static_cast<long long>(mine.size());
    std::vector<long long> sizes(rank_ == root ? size_ : 0);
    Check(MPI_Gather(&n, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, root, comm_), "MPI_Gather");
    std::vector<ByteBuffer> out;
    if (rank_ == root) {
      out.resize(static_cast<std::size_t>(size_));
      for (int r = 0; r < size_; ++r) out[r].resize(static_cast<std::size_t>(sizes[r]));
      for (int r = 0; r < size_; ++r) {
        if (r == root) {
          std::copy(mine.begin(), mine.end(), out[r].begin());
        } else {
          Recv(out[r].data(), out[r].size(), r);
        }
      }
    } else {
      Send(mine.data(), mine.size(), root);
    }
    return out;
  }

  void Broadcast(ByteBuffer& buffer, int root) override {
    long long n = static_cast<long long>(buffer.size());
    Check(MPI_Bcast(&n, 1, MPI_LONG_LONG, root, comm_), "MPI_Bcast");
    buffer.resize(static_cast<std::size_t>(n));
    for (std::size_t pos = 0; pos < buffer.size(); pos += kMaxCount) {
      const int count = static_cast<int>(std::min(kMaxCount, buffer.size() - pos));
      Check(MPI_Bcast(buffer.data() + pos, count, MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }

  void AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    const MPI_Datatype t = MpiType(dtype);
    if (t == MPI_DATATYPE_NULL) return Comm::AllReduce(data, count, dtype, op);
    const std::size_t item = DTypeSize(dtype);
    for (std::size_t pos = 0; pos < count; pos += kMaxCount) {
      const int n = static_cast<int>(std::min(kMaxCount, count - pos));
      Check(MPI_Allreduce(MPI_IN_PLACE, static_cast<uint8_t*>(data) + pos * item, n, t, MpiOp(op), comm_),
            "MPI_Allreduce");
    }
  }

  void ReduceScatter(const void* send, void* recv, std::size_t block_count, DType dtype, ReduceOp op) override {
    const MPI_Datatype t = MpiType(dtype);
    if (t == MPI_DATATYPE_NULL || block_count > kMaxCount) {
      return Comm::ReduceScatter(send, recv, block_count, dtype, op);
    }
    Check(MPI_Reduce_scatter_block(send, recv, static_cast<int>(block_count), t, MpiOp(op), comm_),
          "MPI_Reduce_scatter_block");
  }

  void AllGatherInto(const void* send, void* recv, std::size_t block_bytes) override {
    if (block_bytes > kMaxCount) return Comm::AllGatherInto(send, recv, block_bytes);
    Check(MPI_Allgather(send, static_cast<int>(block_bytes), MPI_BYTE, recv, static_cast<int>(block_bytes), MPI_BYTE,
                        comm_),
          "MPI_Allgather");
  }

  std::unique_ptr<Comm> Split(int color, int key) override {
    MPI_Comm sub;
    Check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return std::make_unique<MpiComm>(sub);
  }

  // For another thread (SaveAsync's background): MPI must allow concurrent calls.
  std::unique_ptr<Comm> Dup() override {
    int level = MPI_THREAD_SINGLE;
    Check(MPI_Query_thread(&level), "MPI_Query_thread");
    if (level < MPI_THREAD_MULTIPLE) {
      throw Error(ErrorCode::kUnsupported,
                  "MpiComm::Dup: a group used from a second thread (SaveAsync) needs MPI initialised with "
                  "MPI_THREAD_MULTIPLE (ckpt::MpiSession does; MPI_Init_thread gave less)");
    }
    MPI_Comm dup;
    Check(MPI_Comm_dup(comm_, &dup), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    return std::make_unique<MpiComm>(dup);
  }

 private:
  void Send(const uint8_t* p, std::size_t n, int to) {
    for (std::size_t pos = 0; pos < n; pos += kMaxCount) {
      Check(MPI_Send(p + pos, static_cast<int>(std::min(kMaxCount, n - pos)), MPI_BYTE, to, kTag, comm_), "MPI_Send");
    }
  }
  void Recv(uint8_t* p, std::size_t n, int from) {
    for (std::size_t pos = 0; pos < n; pos += kMaxCount) {
      Check(MPI_Recv(p + pos, static_cast<int>(std::min(kMaxCount, n - pos)), MPI_BYTE, from, kTag, comm_,
                     MPI_STATUS_IGNORE),
            "MPI_Recv");
    }
  }

  static constexpr int kTag = 0x636b;  // "ck"
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

std::unique_ptr<Comm> Dup(MPI_Comm comm) {
  MPI_Comm dup;
  Check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  // Errors come back as return codes, turned into ckpt::Error, instead of aborting the job.
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return std::make_unique<MpiComm>(dup);
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // MULTIPLE: SaveAsync's background thread runs collectives on its own communicator
    // while the caller's thread uses another.
    Check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    owns_ = true;
  }
}

MpiSession::~MpiSession() {
  if (owns_) MPI_Finalize();
}

std::unique_ptr<Comm> MpiWorld() { return Dup(MPI_COMM_WORLD); }
std::unique_ptr<Comm> MpiFromFortranHandle(long fortran_handle) {
  return Dup(MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle)));
}

}  // namespace ckpt
