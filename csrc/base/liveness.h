// Detecting a rank that died, so that the others raise instead of hanging.
//
// MPI cannot tell us that a peer is gone: a collective with a dead peer simply
// never completes. The peer monitor knows the pid of every rank on this host
// (exchanged at init) and checks them every 100 ms through /proc. When one is
// gone (or a zombie), it records which rank was lost; every wait loop of the
// core (progress.h) then throws Error(COMMLIB_ERR_PEER_LOST) naming that rank.
// Ranks on other hosts are covered by the launcher, which ends the job when a
// rank exits abnormally.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace commlib {

struct PeerInfo {
  int rank;
  pid_t pid;
  std::string host;
};

// Starts watching the given peers (those on this host, except ourselves).
// first_lost, when given, is a slot shared by the host's ranks (in the
// shared-memory segment) holding 1 + the first rank found dead: a survivor
// that exits after reporting must not be named instead of the rank that died
// first when another rank's monitor sees both gone at once.
void start_peer_monitor(const std::vector<PeerInfo>& local_peers,
                        std::atomic<int32_t>* first_lost = nullptr);
void stop_peer_monitor();

// -1 while every watched peer is alive.
int lost_rank();
std::string lost_peer_message();
void throw_if_peer_lost();

}  // namespace commlib
