#include "backends/mpi/mpi_transport.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/common.h"
#include "base/progress.h"
#include "base/reduce.h"

namespace commlib {
namespace {

MPI_Comm g_job_comm = MPI_COMM_NULL;

// Floating-point Min and Max as the core's own kernels compute them (a NaN on
// any rank wins, Min of zeros is -0 and Max +0: the same bits in any order):
// MPI's built-in MPI_MIN/MPI_MAX keep or drop a NaN, and pick a zero's sign,
// by the order in which the library combines ranks, so ranks could end up
// with different results.
template <int Op>
void nan_keeping(void* in, void* inout, int* len, MPI_Datatype* type) {
  const int dtype = *type == MPI_DOUBLE ? COMMLIB_FLOAT64 : COMMLIB_FLOAT32;
  reduce_into(dtype, Op, inout, in, size_t(*len));
}

MPI_Op user_op(MPI_User_function* f) {
  MPI_Op o;
  MPI_Op_create(f, /*commute=*/1, &o);
  return o;
}

MPI_Op float_op(int op) {
  static const MPI_Op min_op = user_op(&nan_keeping<COMMLIB_MIN>);
  static const MPI_Op max_op = user_op(&nan_keeping<COMMLIB_MAX>);
  return op == COMMLIB_MAX ? max_op : min_op;
}

}  // namespace

MPI_Op mpi_op(int dtype, int op) {
  if (dtype == COMMLIB_BOOL) {
    return (op == COMMLIB_SUM || op == COMMLIB_MAX) ? MPI_LOR : MPI_LAND;
  }
  if ((dtype == COMMLIB_FLOAT32 || dtype == COMMLIB_FLOAT64) && (op == COMMLIB_MIN || op == COMMLIB_MAX)) {
    return float_op(op);
  }
  switch (op) {
    case COMMLIB_SUM: case COMMLIB_AVERAGE: return MPI_SUM;
    case COMMLIB_MIN: return MPI_MIN;
    case COMMLIB_MAX: return MPI_MAX;
    case COMMLIB_PRODUCT: return MPI_PROD;
  }
  throw Error(COMMLIB_ERR_TYPE, "unknown reduction op");
}

void MpiTransport::set_job(MPI_Comm job, size_t call_bytes) {
  g_job_comm = job;
  call_bytes_ = call_bytes;
}

std::string MpiTransport::open_peers(std::vector<MPI_Request>& reqs, const std::vector<int>& peers) const {
  std::vector<int> open;
  for (size_t i = 0; i < reqs.size(); ++i) {
    int flag = 0;
    MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
    if (!flag) open.push_back(peers[i]);
  }
  return job_ranks(open);
}

std::string MpiTransport::job_ranks(const std::vector<int>& ranks) const {
  std::vector<int> job(ranks.size(), MPI_UNDEFINED);
  std::vector<int> open = ranks;
  MPI_Group mine, theirs;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(g_job_comm == MPI_COMM_NULL ? comm_ : g_job_comm, &theirs);
  if (!open.empty()) MPI_Group_translate_ranks(mine, int(open.size()), open.data(), theirs, job.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&theirs);
  std::string out;
  for (int r : job) out += (out.empty() ? "" : ", ") + (r == MPI_UNDEFINED ? std::string("?") : std::to_string(r));
  return "rank" + std::string(job.size() == 1 ? " [" : "s [") + out + "]";
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(COMMLIB_ERR_INTERNAL, std::string(what) + " failed: " + std::string(msg, len));
}

MPI_Datatype mpi_datatype(int dtype) {
  switch (dtype) {
    case COMMLIB_UINT8: return MPI_UINT8_T;
    case COMMLIB_INT8: return MPI_INT8_T;
    case COMMLIB_INT32: return MPI_INT32_T;
    case COMMLIB_INT64: return MPI_INT64_T;
    case COMMLIB_FLOAT32: return MPI_FLOAT;
    case COMMLIB_FLOAT64: return MPI_DOUBLE;
    case COMMLIB_BOOL: return MPI_C_BOOL;
    case COMMLIB_INT16: return MPI_INT16_T;
    case COMMLIB_UINT16: return MPI_UINT16_T;
    case COMMLIB_UINT32: return MPI_UINT32_T;
    case COMMLIB_UINT64: return MPI_UINT64_T;
  }
  throw Error(COMMLIB_ERR_TYPE, std::string("no MPI datatype for ") + dtype_name(dtype));
}

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiTransport::~MpiTransport() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiTransport::abandon() { comm_ = MPI_COMM_NULL; }

std::unique_ptr<MpiTransport> MpiTransport::subset(const std::vector<int>& ranks) {
  MPI_Request arrived;
  check_mpi(MPI_Ibarrier(comm_, &arrived), "MPI_Ibarrier");
  complete(&arrived);
  bool member = false;
  for (int r : ranks) member |= r == rank_;
  MPI_Comm sub = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, rank_, &sub), "MPI_Comm_split");
  if (!member) return nullptr;
  return std::make_unique<MpiTransport>(sub);
}

void MpiTransport::complete(MPI_Request* req) {
  poll_until([&] {
    int flag = 0;
    check_mpi(MPI_Test(req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }, /*may_sleep=*/false, [&] {
    std::vector<int> others;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) others.push_back(r);
    return "an MPI collective with " + job_ranks(others);
  });
}

int MpiTransport::start(const std::vector<P2POp>& ops) {
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  reqs.reserve(ops.size());
  for (const P2POp& op : ops) {
    // Split messages beyond one call into tagged pieces.
    char* p = static_cast<char*>(op.buf);
    size_t left = op.bytes;
    int tag = 0;
    do {
      const size_t n = std::min(left, call_bytes_);
      MPI_Request r;
      if (op.kind == P2POp::kSend) {
        check_mpi(MPI_Isend(p, int(n), MPI_BYTE, op.peer, tag, comm_, &r), "MPI_Isend");
      } else {
        check_mpi(MPI_Irecv(p, int(n), MPI_BYTE, op.peer, tag, comm_, &r), "MPI_Irecv");
      }
      reqs.push_back(r);
      peers.push_back(op.peer);
      p += n;
      left -= n;
      ++tag;
    } while (left > 0);
  }
  const int ticket = next_ticket_++;
  pending_[ticket] = std::move(reqs);
  peers_[ticket] = std::move(peers);
  return ticket;
}

void MpiTransport::wait(int ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end()) throw Error(COMMLIB_ERR_INTERNAL, "unknown transport ticket");
  std::vector<MPI_Request> reqs = std::move(it->second);
  pending_.erase(it);
  const std::vector<int> peers = std::move(peers_[ticket]);
  peers_.erase(ticket);
  poll_until([&] {
    int flag = 0;
    check_mpi(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    return flag != 0;
  }, /*may_sleep=*/false, [&] { return open_peers(reqs, peers); });
}

void MpiTransport::allreduce(const void* in, void* out, size_t count, int dtype, int op) {
  const size_t esize = dtype_size(dtype);
  const MPI_Datatype dt = mpi_datatype(dtype);
  const MPI_Op mop = mpi_op(dtype, op);
  const size_t piece = std::max<size_t>(1, call_bytes_ / esize);
  size_t done = 0;
  do {
    const size_t n = std::min(count - done, piece);
    const void* src = in == out ? MPI_IN_PLACE : static_cast<const char*>(in) + done * esize;
    MPI_Request r;
    check_mpi(MPI_Iallreduce(src, static_cast<char*>(out) + done * esize, int(n), dt, mop, comm_, &r),
              "MPI_Iallreduce");
    complete(&r);
    done += n;
  } while (done < count);
}

void MpiTransport::allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  std::vector<size_t> displ(size_);
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    displ[r] = total;
    total += bytes[r];
  }
  char* const base = static_cast<char*>(out);
  if (!in_one_call(total)) {
    std::vector<const char*> from(size_, static_cast<const char*>(in));
    std::vector<char*> to(size_);
    for (int r = 0; r < size_; ++r) to[r] = base + displ[r];
    std::vector<size_t> send(size_, bytes[rank_]);
    return exchange_blocks(from, send, to, bytes);
  }
  std::vector<int> counts(bytes.begin(), bytes.end()), displs(displ.begin(), displ.end());
  // (this rank's part already in place in out: MPI forbids passing it as the input too)
  if (in == base + displ[rank_]) in = MPI_IN_PLACE;
  MPI_Request r;
  if (std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; })) {
    // Every rank knows every count, so all take this branch or none. (MPICH's
    // Iallgather: 14.7 us at 64 KiB a rank where Iallgatherv takes 21.)
    check_mpi(MPI_Iallgather(in, in == MPI_IN_PLACE ? 0 : counts[0], MPI_BYTE, out, counts[0], MPI_BYTE,
                             comm_, &r),
              "MPI_Iallgather");
    complete(&r);
    return;
  }
  check_mpi(MPI_Iallgatherv(in, counts[rank_], MPI_BYTE, out, counts.data(), displs.data(),
                            MPI_BYTE, comm_, &r),
            "MPI_Iallgatherv");
  complete(&r);
}

void MpiTransport::broadcast(void* buf, size_t bytes, int root) {
  size_t done = 0;
  do {
    const size_t n = std::min(bytes - done, call_bytes_);
    MPI_Request r;
    check_mpi(MPI_Ibcast(static_cast<char*>(buf) + done, int(n), MPI_BYTE, root, comm_, &r),
              "MPI_Ibcast");
    complete(&r);
    done += n;
  } while (done < bytes);
}

void MpiTransport::alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                             const std::vector<size_t>& recv_bytes, size_t widest) {
  if (!in_one_call(widest)) {
    std::vector<const char*> from(size_, static_cast<const char*>(in));
    std::vector<char*> to(size_, static_cast<char*>(out));
    for (int r = 1; r < size_; ++r) {
      from[r] = from[r - 1] + send_bytes[r - 1];
      to[r] = to[r - 1] + recv_bytes[r - 1];
    }
    return exchange_blocks(from, send_bytes, to, recv_bytes);
  }
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  size_t so = 0, ro = 0;
  for (int r = 0; r < size_; ++r) {
    sc[r] = int(send_bytes[r]);
    sd[r] = int(so);
    rc[r] = int(recv_bytes[r]);
    rd[r] = int(ro);
    so += send_bytes[r];
    ro += recv_bytes[r];
  }
  MPI_Request r;
  check_mpi(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(),
                           MPI_BYTE, comm_, &r),
            "MPI_Ialltoallv");
  complete(&r);
}

void MpiTransport::alltoall(const void* in, size_t block_bytes, void* out) {
  if (!in_one_call(block_bytes * size_t(size_))) {
    const std::vector<size_t> blocks(size_, block_bytes);
    return alltoallv(in, blocks, out, blocks, block_bytes * size_t(size_));
  }
  // (MPICH's Ialltoall at 512 KiB blocks: 49 us where Ialltoallv takes 106)
  MPI_Request r;
  check_mpi(MPI_Ialltoall(in, int(block_bytes), MPI_BYTE, out, int(block_bytes), MPI_BYTE, comm_, &r),
            "MPI_Ialltoall");
  complete(&r);
}

void MpiTransport::reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts,
                                  int dtype, int op) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (!in_one_call(total * dtype_size(dtype))) return reduce_scatter_windows(in, out, counts, dtype, op);
  std::vector<int> c(counts.begin(), counts.end());
  MPI_Request r;
  check_mpi(MPI_Ireduce_scatter(in, out, c.data(), mpi_datatype(dtype), mpi_op(dtype, op), comm_, &r),
            "MPI_Ireduce_scatter");
  complete(&r);
}

}  // namespace commlib
