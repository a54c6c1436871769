#include "exec/executor.h"

#include "base/common.h"

namespace commlib {

void Executor::setup(MpiTransport* world, ShmSegment* shm, Transport* cross, AllreduceAlgo algo,
                     int shm_collectives) {
  world_ = world;
  shm_ = shm;
  cross_ = cross;
  algo_ = algo;
  shm_collectives_ = shm_collectives;
}

void Executor::check_member(int process_set) const {
  if (process_set != 0 && !sets_.count(process_set)) {
    throw Error(COMMLIB_ERR_INTERNAL, "asked to run on process set " + std::to_string(process_set) +
                                          ", which this rank is not in");
  }
}

Transport& Executor::transport_for(int process_set) {
  check_member(process_set);
  return process_set != 0 ? static_cast<Transport&>(*sets_.at(process_set)) : *world_;
}

int Executor::run(const Response& resp, const std::vector<Entry*>& entries, size_t fusion_threshold,
                  std::string* message) {
  check_member(resp.process_set);
  const bool set = resp.process_set != 0;
  Transport& transport = set ? static_cast<Transport&>(*sets_.at(resp.process_set)) : *world_;
  OpContext ctx{transport, fusion_, scratch_, algo_, fusion_threshold, set ? nullptr : shm_,
                set ? nullptr : cross_, shm_collectives_};
  try {
    dispatch(ctx, resp, entries);
  } catch (const Error& e) {
    // Value/type problems are detected identically on every rank before any
    // data moves; anything else leaves the job in an unknown state.
    if (e.code() != COMMLIB_ERR_VALUE && e.code() != COMMLIB_ERR_TYPE) throw;
    *message = e.what();
    return e.code();
  }
  return COMMLIB_OK;
}

void Executor::dispatch(OpContext& ctx, const Response& resp, const std::vector<Entry*>& entries) {
  switch (resp.op_type) {
    case COMMLIB_OP_ALLREDUCE: run_allreduce(ctx, entries); break;
    case COMMLIB_OP_ALLGATHER:  // (several: fused, csrc/exec/fused_gathers.cc)
      entries.size() > 1 ? run_allgather_fused(ctx, entries, resp.rows) : run_allgather(ctx, *entries[0], resp.rows);
      break;
    case COMMLIB_OP_BROADCAST:
      entries.size() > 1 ? run_broadcast_fused(ctx, entries) : run_broadcast(ctx, *entries[0]);
      break;
    case COMMLIB_OP_ALLTOALL: run_alltoall(ctx, *entries[0], resp.rows); break;
    case COMMLIB_OP_REDUCESCATTER:
      entries.size() > 1 ? run_reducescatter_fused(ctx, entries) : run_reducescatter(ctx, *entries[0]);
      break;
    case COMMLIB_OP_BARRIER: break;  // negotiation itself synchronised every rank
  }
}

void Executor::add_set(int id, const std::vector<int>& members) {
  std::unique_ptr<MpiTransport> t = world_->subset(members);
  if (t) sets_[id] = std::move(t);
}

void Executor::abandon() {
  for (auto& [id, t] : sets_) t->abandon();
}

void Executor::clear() { sets_.clear(); }

}  // namespace commlib
