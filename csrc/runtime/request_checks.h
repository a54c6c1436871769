// Checks of a caller's request before it is queued (caller threads): its
// arguments, and the rows per rank that its splits give. Each throws
// Error(COMMLIB_ERR_VALUE or COMMLIB_ERR_TYPE) naming what is wrong.
#pragma once

#include <cstdint>
#include <vector>

#include "base/entry.h"
#include "commlib/c_api.h"

namespace commlib {

// A collective; members: the job ranks of the request's process set.
void validate_request(const commlib_request& q, const std::vector<int>& members);

// The members of a group write their results into separate memory (one
// array given twice in place would be reduced twice, the result depending on
// the algorithm).
void check_disjoint_outputs(const std::vector<Member>& members);

// A reducescatter's explicit rows per rank (none: the even split).
std::vector<int64_t> reducescatter_splits(const commlib_request& q, int size);

// Rows sent to each rank (of the process set) by an alltoall: explicit
// splits or equal parts.
std::vector<int64_t> alltoall_splits(const commlib_request& q, int size);

// A send or recv; members: the process set's ranks (null: the global set,
// every job rank); size: the job's ranks.
void validate_p2p(const commlib_request& q, const std::vector<int>* members, int size);

}  // namespace commlib
