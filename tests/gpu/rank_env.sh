#!/usr/bin/env bash
# Runs "$@" as one rank of several sharing one GPU (../shared/GPU.md): NCCL
# refuses two ranks of a communicator on one device unless each believes it
# is its own host, so every rank gets its own NCCL_HOSTID (from the rank the
# MPI launcher gives it) and NCCL moves data over loopback sockets.
rank="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-0}}}"
export NCCL_HOSTID="${NCCL_HOSTID_PREFIX:-commlibcheck}${rank}"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # (what NCCL itself says when a communicator stalls or fails)
exec "$@"
