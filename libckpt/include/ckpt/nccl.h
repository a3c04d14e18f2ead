// ckpt/nccl.h: the NCCL backend of ckpt::Comm (link ckpt::nccl; built when CMake finds NCCL
// and the CUDA toolkit, CKPT_WITH_NCCL). No NCCL or CUDA type appears here.
//
// One rank per GPU. The tensor collectives (AllReduce, ReduceScatter, AllGatherInto: the
// runtime's gradient reduction and parameter gathering) run over NCCL on a stream of ckpt's
// own: buffers in device memory go straight to NCCL, buffers in host memory are staged
// through device scratch memory first. NCCL sums in its own order (not rank order as the host
// backends do): results are identical on every rank, but not bit-identical to ThreadComm's
// or MPI's.
//
// Errors and aborts: the communicator is non-blocking; every wait polls NCCL's async error
// and a deadline. A rank that waits longer than Options::timeout (a peer died or never came)
// aborts the communicator (ncclCommAbort) and throws kComm, as does every rank that meets an
// NCCL error: no rank hangs forever. An aborted communicator throws kComm on every later call.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>

#include "ckpt/comm.h"

namespace ckpt::nccl {

struct Options {
  // The CUDA device of this rank; -1: the device current on the calling thread.
  int device = -1;
  // How long bootstrap and any one collective may wait before the communicator is aborted.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

// Bootstraps over `host`: rank 0 makes the NCCL unique id and broadcasts it over `host` (over
// MPI when `host` is ckpt::MpiWorld()). The result has host's ranks and size. The byte
// collectives of the save protocol (Gather, Broadcast, Barrier, AllGather) stay on `host`,
// which must outlive the result; Split splits both.
CKPT_API std::unique_ptr<Comm> OverComm(Comm& host, const Options& options = {});

// Bootstraps over a file in a directory every rank sees: rank 0 writes the unique id to a
// temporary file and links it to `file` (failing with kAlreadyExists if `file` exists: use
// a fresh path per job), the others poll for it until Options::timeout, then throw kComm
// naming the file. Every collective then runs over NCCL, the byte collectives through
// device scratch memory.
CKPT_API std::unique_ptr<Comm> OverFile(const std::filesystem::path& file, int rank, int size,
                                        const Options& options = {});

}  // namespace ckpt::nccl
