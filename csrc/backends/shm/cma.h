// Single-copy reads from another process of this host (Linux cross-memory
// attach, process_vm_readv): the receiver copies a large message straight
// from the sender's buffer, with no staging copy in between.
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace commlib {

// Lets other processes of this user read this one's memory where the kernel's
// Yama policy would otherwise allow only ancestors (harmless where it is off).
void allow_direct_reads();

// Copies `bytes` bytes at address `remote` of process `pid` into `dst`.
// False (errno set) when the kernel refuses: the caller falls back to MPI.
bool read_from_process(pid_t pid, uint64_t remote, void* dst, size_t bytes);
// The other way: copies `bytes` bytes from `src` to address `remote` of `pid`.
bool write_to_process(pid_t pid, uint64_t remote, const void* src, size_t bytes);

// Collective over local_comm (this host's ranks, each having called
// allow_direct_reads): every rank reads a word from the next one. The pids
// by local rank when every read worked, else none (empty): what a
// collective that reads its peers' buffers directly may rely on alike on
// every rank.
std::vector<pid_t> probe_direct_reads(MPI_Comm local_comm);

}  // namespace commlib
