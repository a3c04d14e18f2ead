// ckpt/mpi.h: the MPI backend of ckpt::Comm (real processes, one or many machines).
// Built when CMake finds MPI (CKPT_WITH_MPI); link ckpt::mpi. No MPI type appears here:
// communicators cross this boundary as Fortran handles (MPI_Comm_c2f / MPI_Comm_f2c).
#pragma once

#include <memory>

#include "ckpt/comm.h"

namespace ckpt {

// Initialises MPI (if nobody has yet; asking for MPI_THREAD_MULTIPLE, which SaveAsync's
// background thread needs) for the life of this object and finalises it
// when the object goes away, if it did the initialising.
class CKPT_API MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owns_ = false;
};

// A Comm over MPI_COMM_WORLD (duplicated, so ckpt's messages never mix with the caller's).
CKPT_API std::unique_ptr<Comm> MpiWorld();
// A Comm over the communicator whose Fortran handle is `fortran_handle` (duplicated).
CKPT_API std::unique_ptr<Comm> MpiFromFortranHandle(long fortran_handle);

}  // namespace ckpt
