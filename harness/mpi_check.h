// KVB_MPI_CHECK(call): throws kvb::Error naming the MPI call and its error code unless it returned
// MPI_SUCCESS. Only in builds with MPI (KVB_WITH_MPI).
#pragma once

#ifdef KVB_WITH_MPI
#include <mpi.h>

#include "common/error.h"

#define KVB_MPI_CHECK(call)                                                           \
  do {                                                                                \
    const int kvb_rc = (call);                                                        \
    KVB_CHECK(kvb_rc == MPI_SUCCESS) << #call << " failed with MPI error " << kvb_rc; \
  } while (0)
#endif
