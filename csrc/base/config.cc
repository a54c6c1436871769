#include "base/config.h"

#include <cstdlib>
#include <limits>

#include "base/common.h"
#include "base/parse.h"

namespace commlib {
namespace {

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMiB = int64_t(1) << 20;
constexpr int64_t kBillion = 1000000000;

std::string int_range(int64_t min, int64_t max) {
  if (max == kNoMax) return "integer >= " + std::to_string(min);
  return "integer " + std::to_string(min) + " to " + std::to_string(max);
}

ConfigEntry base_entry(const char* name, ConfigKind kind, const char* dflt, const char* meaning) {
  ConfigEntry e{};
  e.name = name;
  e.kind = kind;
  e.default_text = dflt;
  e.meaning = meaning;
  return e;
}

ConfigEntry int_entry(const char* name, const char* dflt, int64_t min, int64_t max, int64_t Config::*field,
                      const char* meaning) {
  ConfigEntry e = base_entry(name, ConfigKind::kInt, dflt, meaning);
  e.min = min;
  e.max = max;
  e.int_field = field;
  e.accepted = int_range(min, max);
  return e;
}

ConfigEntry double_entry(const char* name, const char* dflt, double min, double max, double Config::*field,
                         const char* meaning) {
  ConfigEntry e = base_entry(name, ConfigKind::kDouble, dflt, meaning);
  e.dmin = min;
  e.dmax = max;
  e.double_field = field;
  e.accepted = "number " + std::to_string(int64_t(min)) + " to " + std::to_string(int64_t(max));
  return e;
}

ConfigEntry bool_entry(const char* name, const char* dflt, bool Config::*field, const char* meaning) {
  ConfigEntry e = base_entry(name, ConfigKind::kBool, dflt, meaning);
  e.bool_field = field;
  e.accepted = "0 or 1";
  return e;
}

ConfigEntry choice_entry(const char* name, const char* dflt, const char* choices, std::string Config::*field,
                         const char* meaning) {
  ConfigEntry e = base_entry(name, ConfigKind::kChoice, dflt, meaning);
  e.choices = choices;
  e.text_field = field;
  e.accepted = list_choices(choices);
  return e;
}

ConfigEntry path_entry(const char* name, const char* dflt, std::string Config::*field, const char* meaning) {
  ConfigEntry e = base_entry(name, ConfigKind::kText, dflt, meaning);
  e.text_field = field;
  e.accepted = "a path";
  return e;
}

// Up to max_len lowercase hex digits (a token another program chose).
ConfigEntry token_entry(const char* name, int64_t max_len, std::string Config::*field, const char* meaning) {
  ConfigEntry e = base_entry(name, ConfigKind::kText, "", meaning);
  e.max = max_len;
  e.text_field = field;
  e.accepted = "up to " + std::to_string(max_len) + " hex digits";
  return e;
}

std::vector<ConfigEntry> make_table() {
  using C = Config;
  return {
      int_entry("COMMLIB_FUSION_THRESHOLD", "67108864", 0, kNoMax, &C::fusion_threshold,
                "bytes of small allreduces (and of allgathers, reducescatters, broadcasts of one root on the host) fused "
                "into one collective"),
      double_entry("COMMLIB_CYCLE_TIME", "1", 0, 1e9, &C::cycle_time_ms,
                   "ms: longest time new requests are held back to be batched "
                   "(never while a thread waits in synchronize)"),
      int_entry("COMMLIB_BATCH_GAP_US", "20", 0, kBillion, &C::batch_gap_us,
                "us: requests are held while new ones keep arriving within this gap"),
      int_entry("COMMLIB_GPU_BUCKET_BYTES", "26214400", 0, kNoMax, &C::gpu_bucket_bytes,
                "CUDA requests are held until this many bytes of them wait (or none arrived for "
                "COMMLIB_CYCLE_TIME, or a thread waits): few, large NCCL launches per step; 0: as CPU requests"),
      choice_entry("COMMLIB_ALLREDUCE_ALGO", "auto", "auto|shm|ring|tree|mpi", &C::allreduce_algo,
                   "allreduce algorithm: auto (shared memory within a host, hierarchical across hosts; "
                   "tree below 16 KiB and ring above without shared memory), or always shm, ring, tree, "
                   "or mpi (the MPI library's collective)"),
      choice_entry("COMMLIB_SHM_COLLECTIVES", "auto", "auto|always|never", &C::shm_collectives,
                   "shared-memory broadcast/allgather/alltoall/reducescatter: auto (always, but alltoalls "
                   "from 16 MiB sent by a rank, allgathers from a 64 MiB result at 2 ranks and "
                   "broadcasts from 64 MiB at more are read in one copy, see COMMLIB_P2P_SINGLE_COPY), "
                   "always, never"),
      bool_entry("COMMLIB_SHM", "1", &C::shm, "0 disables the shared-memory segments (collectives' and point-to-point's)"),
      // (the shared segment holds 8 pieces and 2 fusion regions per local
      // rank, touched at init: larger values would only exhaust /dev/shm;
      // pieces below a page make the all-reduce a hand-off per 64 bytes,
      // which on a loaded host took minutes for 1 MiB)
      int_entry("COMMLIB_SHM_PIECE_BYTES", "262144", 4096, 16 * kMiB, &C::shm_piece_bytes,
                "pipeline piece size of the shared-memory all-reduce at 4 ranks on a host (each rank's "
                "block of 4 pieces' worth is cut into one piece per local rank)"),
      int_entry("COMMLIB_SHM_FUSION_BYTES", "4194304", 0, 128 * kMiB, &C::shm_fusion_bytes,
                "bytes of each rank's fusion region in the shared segment; 0: none (fused allreduces are "
                "packed in private memory; broadcast, allgather, alltoall and reducescatter go through "
                "MPI, and no collective reads a peer's buffer in one copy)"),
      token_entry("COMMLIB_RUN_JOB", 32, &C::run_job,
                  "set by commlibrun: its job's token, part of the named (fallback) shared segments' names "
                  "(commlibrun removes what a killed job left)"),
      bool_entry("COMMLIB_AUTOTUNE", "0", &C::autotune,
                 "1: during the first steps rank 0 tries fusion thresholds, cycle times and (where the ring "
                 "and the tree run: no shared memory, or several hosts) tree/ring cutoffs, scores each by "
                 "the allreduced bytes per second, and keeps the best; every rank applies each setting at "
                 "the same point of its collectives"),
      path_entry("COMMLIB_AUTOTUNE_LOG", "", &C::autotune_log,
                 "path of the CSV rank 0 writes with autotune: every setting tried, its score, the chosen "
                 "one marked; empty: none"),
      int_entry("COMMLIB_AUTOTUNE_WINDOW_STEPS", "5", 1, kBillion, &C::autotune_window_steps,
                "autotune: steps (a step ends where a tensor name recurs) per measuring window"),
      int_entry("COMMLIB_AUTOTUNE_WINDOWS", "2", 1, 1000, &C::autotune_windows,
                "autotune: windows scored per setting (their median), after one discarded window"),
      int_entry("COMMLIB_CACHE_CAPACITY", "1024", 0, kNoMax, &C::cache_capacity,
                "response cache bits (requests that skip negotiation; at most 65535 are used); "
                "0 disables the cache"),
      int_entry("COMMLIB_STALL_CHECK_TIME", "60", 0, kBillion, &C::stall_check_time_s,
                "seconds before rank 0 warns about a tensor some ranks never submitted (a cached "
                "request that waits half as long goes to rank 0, so that the warning names the "
                "missing ranks), and a rank about an NCCL communicator not created yet"),
      int_entry("COMMLIB_TIMEOUT", "300", 0, kBillion, &C::timeout_s,
                "seconds after which a collective some ranks never submitted fails on the ranks that did, "
                "and a receive with no matching send fails (CollectiveTimeoutError naming the missing "
                "ranks); a collective whose data transfer makes no progress for this long (a peer frozen "
                "or cut off mid-collective) fails too, and ends commlib on that rank; 0: wait forever"),
      int_entry("COMMLIB_SPIN_US", "2000", 0, kBillion, &C::spin_us,
                "us a waiting thread spins before it sleeps (with sched_yield; the first 5 us without, where "
                "every rank of the host can have a core)"),
      int_entry("COMMLIB_BG_SPIN_US", "100", 0, kBillion, &C::bg_spin_us,
                "us the background thread spins (with sched_yield) before it naps, in a wait inside a "
                "collective or when idle (it shares the cores with the training threads, whose compute "
                "its spinning would slow down)"),
      int_entry("COMMLIB_RESULT_CACHE_BYTES", "536870912", 0, kNoMax, &C::result_cache_bytes,
                "bytes of freed large allgather/alltoall results kept for reuse; 0 disables"),
      int_entry("COMMLIB_P2P_EAGER_BYTES", "65536", 0, int64_t(1) << 30, &C::p2p_eager_bytes,
                "point-to-point messages up to this size travel inside their header "
                "(at most 4096 between ranks of one host)"),
      int_entry("COMMLIB_P2P_SPLIT_BYTES", "262144", 0, kNoMax, &C::p2p_split_bytes,
                "point-to-point messages from this size on (and at least 65536) between ranks of "
                "one host are copied by both ranks at once"),
      bool_entry("COMMLIB_P2P_SINGLE_COPY", "1", &C::p2p_single_copy,
                 "0 disables single-copy reads (process_vm_readv) between ranks of one host: point-to-point, "
                 "alltoalls from 16 MiB sent by a rank (then through MPI), allgathers from a 64 MiB result at "
                 "2 ranks, broadcasts from 64 MiB at more than 2 ranks"),
      path_entry("COMMLIB_TIMELINE", "", &C::timeline,
                 "path of a Chrome-trace JSON timeline written from init on (rank 0 writes the path, "
                 "rank r <stem>.rank<r><ext>; python -m commlib.timeline merges them); empty: off"),
      bool_entry("COMMLIB_TIMELINE_MARK_CYCLES", "0", &C::timeline_mark_cycles,
                 "1 adds a marker to the timeline for every busy cycle of the background loop"),
      choice_entry("COMMLIB_GPU_BACKEND", "auto", "auto|nccl|host", &C::gpu_backend,
                   "CUDA tensors: auto (NCCL when it and the CUDA runtime load, else staged through host "
                   "memory), nccl (NCCL or an error), host (always staged through host memory and the CPU path)"),
      choice_entry("COMMLIB_CUDA_SYNC", "stream", "stream|host", &C::cuda_sync,
                   "synchronize() of a collective on CUDA tensors through NCCL: stream (returns once it is "
                   "launched; the caller's current stream waits for it on the device), host (returns once it "
                   "completed on the device)"),
      path_entry("COMMLIB_NCCL_LIBRARY", "", &C::nccl_library,
                 "path of the NCCL library to load (nothing else is tried); empty: the nvidia-nccl-cu* "
                 "wheel's nvidia/nccl/lib/libnccl.so.2, else the system's libnccl.so.2"),
      int_entry("COMMLIB_TEST_RANKS_PER_HOST", "0", 0, std::numeric_limits<int32_t>::max(),
                &C::test_ranks_per_host,
                "testing only: k > 0 treats every k consecutive ranks as one host"),
      int_entry("COMMLIB_TEST_MPI_CALL_BYTES", "1073741824", 8, int64_t(1) << 30, &C::test_mpi_call_bytes,
                "testing only: the most bytes one MPI call moves (MPI counts are int): larger collectives and "
                "messages go in pieces; the same on every rank"),
      int_entry("COMMLIB_TEST_SHM_PAUSE_MS", "0", 0, 600000, &C::test_shm_pause_ms,
                "testing only: ms local rank 0 waits between creating a shared segment and handing it "
                "to the other ranks"),
      bool_entry("COMMLIB_TEST_SHM_NAMED", "0", &C::test_shm_named,
                 "testing only: 1 on a rank makes the shared segments of its host named ones in /dev/shm (the "
                 "fallback when the unnamed memfd_create way fails on a rank of the host)"),
  };
}

[[noreturn]] void bad_value(const ConfigEntry& e, const std::string& text, const std::string& why) {
  throw Error(COMMLIB_ERR_VALUE, std::string(e.name) + "='" + text + "': " + why);
}

void set_int(const ConfigEntry& e, const std::string& text, Config& cfg) {
  int64_t x = 0;
  std::string why;
  if (!parse_int(text, &x, &why)) bad_value(e, text, why);
  if (x < e.min || x > e.max) bad_value(e, text, "out of range (" + e.accepted + ")");
  cfg.*e.int_field = x;
}

void set_double(const ConfigEntry& e, const std::string& text, Config& cfg) {
  double x = 0;
  std::string why;
  if (!parse_double(text, &x, &why)) bad_value(e, text, why);
  if (x < e.dmin || x > e.dmax) bad_value(e, text, "out of range (" + e.accepted + ")");
  cfg.*e.double_field = x;
}

}  // namespace

const std::vector<ConfigEntry>& config_table() {
  static const std::vector<ConfigEntry>* table = new std::vector<ConfigEntry>(make_table());
  return *table;
}

const ConfigEntry* find_config_entry(const std::string& name) {
  for (const ConfigEntry& e : config_table()) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

void set_config_value(const ConfigEntry& e, const std::string& text, Config& cfg) {
  std::string why;
  switch (e.kind) {
    case ConfigKind::kInt:
      set_int(e, text, cfg);
      break;
    case ConfigKind::kDouble:
      set_double(e, text, cfg);
      break;
    case ConfigKind::kBool:
      if (!parse_bool(text, &(cfg.*e.bool_field), &why)) bad_value(e, text, why);
      break;
    case ConfigKind::kChoice:
      if (!parse_choice(text, e.choices, &why)) bad_value(e, text, why);
      cfg.*e.text_field = text;
      break;
    case ConfigKind::kText:
      if (e.max > 0 && (int64_t(text.size()) > e.max ||
                        text.find_first_not_of("0123456789abcdef") != std::string::npos)) {
        bad_value(e, text, "not " + e.accepted);
      }
      cfg.*e.text_field = text;
      break;
  }
}

Config Config::defaults() {
  Config cfg;
  for (const ConfigEntry& e : config_table()) set_config_value(e, e.default_text, cfg);
  return cfg;
}

Config Config::from_env() {
  Config cfg = defaults();
  for (const ConfigEntry& e : config_table()) {
    const char* v = std::getenv(e.name);
    if (v && *v) set_config_value(e, v, cfg);
  }
  return cfg;
}

}  // namespace commlib
