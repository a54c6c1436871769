// The point-to-point control messages (point_to_point.h describes the protocol).
#pragma once

#include <cstdint>

namespace commlib {

constexpr int kCtlTag = 1;  // every control message travels under this MPI tag

enum CtlKind : int32_t {
  kHeader = 1,       // sender -> receiver: a message (and its bytes, when small)
  kAck = 2,          // receiver -> sender: taken (or refused, with the reason)
  kClearToSend = 3,  // receiver -> sender: send the bytes over MPI under this tag
  kBye = 4,          // a rank stops
  kSplit = 5,        // receiver -> sender: write the second half to this address
  kWritten = 6,      // sender -> receiver: the second half is written (or not)
  kDeviceClear = 7,  // receiver -> sender: send a device message over the device link (and its id, when new)
  kWithdraw = 8      // sender -> receiver: a send unmatched for COMMLIB_TIMEOUT withdraws its header
};

}  // namespace commlib
