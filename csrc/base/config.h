// The core's configuration: one table of every COMMLIB_* environment variable
// the core reads (config.cc), parsed once at init into a Config.
//
// Each entry has its name, its default (as text, parsed by the same rules as
// the environment's value), its kind with bounds or names, the Config field
// it sets, and a one-line meaning. The table is the only place that reads
// the environment; README's "Configuration" table lists the same variables
// (tests/unit/test_config_table.py compares them). An empty variable counts
// as unset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace commlib {

struct Config {
  int64_t fusion_threshold = 0;    // bytes
  double cycle_time_ms = 0;
  int64_t batch_gap_us = 0;
  int64_t gpu_bucket_bytes = 0;
  std::string allreduce_algo;      // auto|shm|ring|tree|mpi
  std::string shm_collectives;     // auto|always|never
  bool shm = false;
  int64_t shm_piece_bytes = 0;
  int64_t shm_fusion_bytes = 0;
  bool autotune = false;
  std::string autotune_log;        // CSV path ("": none)
  int64_t autotune_window_steps = 0;
  int64_t autotune_windows = 0;
  int64_t cache_capacity = 0;      // clamped by the engine to the order log's bits
  int64_t stall_check_time_s = 0;
  int64_t timeout_s = 0;
  int64_t spin_us = 0;
  int64_t bg_spin_us = 0;
  int64_t result_cache_bytes = 0;
  int64_t p2p_eager_bytes = 0;
  int64_t p2p_split_bytes = 0;
  bool p2p_single_copy = false;
  int64_t test_ranks_per_host = 0;  // 0: ranks share a host as MPI says
  int64_t test_mpi_call_bytes = 0;  // most bytes one MPI call moves (larger: in pieces)
  int64_t test_shm_pause_ms = 0;   // testing only (backends/shm/host_segment.h)
  bool test_shm_named = false;     // testing only (backends/shm/host_segment.h)
  std::string run_job;             // commlibrun's job token ("": not under commlibrun)
  std::string timeline;            // path of the Chrome-trace timeline ("": off)
  bool timeline_mark_cycles = false;
  std::string gpu_backend;         // auto|nccl|host
  std::string cuda_sync;           // stream|host (read by the frontends' synchronize)
  std::string nccl_library;        // path of libnccl.so.2 ("": the wheel's, else the system's)

  // Every field at the table's default.
  static Config defaults();
  // The defaults overridden by the environment. Throws
  // Error(COMMLIB_ERR_VALUE) "NAME='value': reason" for the first bad value.
  static Config from_env();
};

enum class ConfigKind { kInt, kDouble, kBool, kChoice, kText };

struct ConfigEntry {
  const char* name;
  ConfigKind kind;
  const char* default_text;
  int64_t min, max;      // kInt
  double dmin, dmax;     // kDouble
  const char* choices;   // kChoice: "auto|ring|tree"
  int64_t Config::*int_field;
  double Config::*double_field;
  bool Config::*bool_field;
  std::string Config::*text_field;  // kChoice, kText
  const char* meaning;
  std::string accepted;  // the accepted values in words ("0 to 1048576")
};

// The table, in README order.
const std::vector<ConfigEntry>& config_table();
// The entry named name, or null.
const ConfigEntry* find_config_entry(const std::string& name);
// Parses text as e's value into cfg. Throws Error(COMMLIB_ERR_VALUE)
// "NAME='text': reason".
void set_config_value(const ConfigEntry& e, const std::string& text, Config& cfg);

}  // namespace commlib
