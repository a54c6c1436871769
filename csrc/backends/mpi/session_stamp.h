// Control messages of one session (init() to shutdown()) never reach the
// next one. MPI reuses the context id of a freed communicator for the next
// duplicate, so a message sent late in one session (a worker's departure
// notice, a point-to-point goodbye) could otherwise be received on the next
// session's communicator and be taken for a new one. Every control message
// starts with an int32 kind; its upper 24 bits carry the session number,
// agreed by every rank at init().
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace commlib {

inline uint32_t g_session = 0;  // set by Engine::init before any message moves

inline void stamp_session(std::string& bytes) {
  if (bytes.size() < sizeof(int32_t)) return;
  uint32_t kind;
  std::memcpy(&kind, bytes.data(), sizeof(kind));
  kind = (kind & 0xffu) | (g_session << 8);
  std::memcpy(bytes.data(), &kind, sizeof(kind));
}

// True (and the stamp removed) for a message of this session; false for a
// stale one, to be dropped.
inline bool unstamp_session(std::string& bytes) {
  if (bytes.size() < sizeof(int32_t)) return true;
  uint32_t kind;
  std::memcpy(&kind, bytes.data(), sizeof(kind));
  if ((kind >> 8) != (g_session & 0xffffffu)) return false;
  kind &= 0xffu;
  std::memcpy(bytes.data(), &kind, sizeof(kind));
  return true;
}

}  // namespace commlib
