// Typed reduction and scaling kernels. Written as plain loops over
// restrict-qualified pointers so the compiler vectorises them (-O3).
// float16/bfloat16 are computed in float32 a block at a time and rounded back
// to the half type once per call (see half.h): an algorithm that moves half
// data rounds each step's partial result; the shared-memory and MPI paths
// widen whole buffers to float32 first instead (exec/operations.cc).
#pragma once

#include <cstddef>

namespace commlib {

// acc[i] = acc[i] (op) in[i] for n elements of dtype. op is a COMMLIB_* reduce
// op other than AVERAGE (callers turn Average into Sum + postscale).
// Throws Error(COMMLIB_ERR_TYPE) for unknown combinations.
void reduce_into(int dtype, int op, void* acc, const void* in, size_t n);

// The same, and also stores each result in copy[i] in the same pass (saves
// re-reading acc when the result must be published elsewhere).
void reduce_into_and_copy(int dtype, int op, void* acc, const void* in, void* copy, size_t n);

// The same, with the result multiplied by scale before it is stored (acc and
// copy): what reduce_into_and_copy then scale_buffer on acc and copy give,
// bit for bit, in one pass.
void reduce_into_and_copy_scaled(int dtype, int op, void* acc, const void* in, void* copy, size_t n,
                                 double scale);

// buf[i] *= factor, computed in double for integers (truncated toward zero).
void scale_buffer(int dtype, void* buf, size_t n, double factor);

// Whether (dtype, op) is a supported reduction (checked before sending);
// Adasum: floating-point dtypes (it is not a reduce_into op: allreduce_adasum).
bool reduction_supported(int dtype, int op);

}  // namespace commlib
