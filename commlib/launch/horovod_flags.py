"""commlibrun's tuning options, horovodrun's names: each stands for the
COMMLIB_* variable it sets in every rank (a Horovod launch line keeps
working after ``horovodrun`` becomes ``commlibrun``)."""
from __future__ import annotations

import argparse
import math
import os

from ..horovod_env import NO_STALL_CHECK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("tuning options, as horovodrun's (each sets a COMMLIB_* variable)")
    g.add_argument("--autotune", action="store_true",
                   help="tune the fusion threshold, cycle time and tree/ring cutoff during the "
                        "first steps (sets COMMLIB_AUTOTUNE=1)")
    g.add_argument("--autotune-log-file", metavar="FILE",
                   help="rank 0 writes a CSV of the settings autotune tried and their scores "
                        "(sets COMMLIB_AUTOTUNE_LOG)")
    g.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                   help="fusion buffer size in MiB (COMMLIB_FUSION_THRESHOLD, in bytes)")
    g.add_argument("--cycle-time-ms", type=float, metavar="MS",
                   help="longest time new requests wait to be batched (COMMLIB_CYCLE_TIME)")
    cache = g.add_mutually_exclusive_group()
    cache.add_argument("--cache-capacity", type=int, metavar="N",
                       help="response cache entries (COMMLIB_CACHE_CAPACITY)")
    cache.add_argument("--disable-cache", action="store_true",
                       help="no response cache (COMMLIB_CACHE_CAPACITY=0)")
    g.add_argument("--timeline-filename", metavar="FILE",
                   help="write a Chrome-trace timeline (COMMLIB_TIMELINE)")
    g.add_argument("--timeline-mark-cycles", action="store_true",
                   help="mark the engine's cycles in the timeline (COMMLIB_TIMELINE_MARK_CYCLES=1)")
    stall = g.add_mutually_exclusive_group()
    stall.add_argument("--stall-check-warning-time-seconds", type=int, metavar="S",
                       help="warn about a collective some ranks never submitted after S seconds "
                            "(COMMLIB_STALL_CHECK_TIME)")
    stall.add_argument("--no-stall-check", action="store_true",
                       help="no such warnings")
    g.add_argument("--stall-check-shutdown-time-seconds", type=int, metavar="S",
                   help="fail such a collective after S seconds; 0: wait forever (COMMLIB_TIMEOUT)")


def env_from(args: argparse.Namespace) -> dict:
    """The COMMLIB_* variables the options given stand for; ValueError for a
    value out of range."""
    env = {}
    if args.autotune:
        env["COMMLIB_AUTOTUNE"] = "1"
    if args.autotune_log_file:
        env["COMMLIB_AUTOTUNE_LOG"] = os.path.abspath(args.autotune_log_file)
    for flag in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                 "stall_check_warning_time_seconds", "stall_check_shutdown_time_seconds"):
        value = getattr(args, flag)
        if value is not None and not 0 <= value < math.inf:  # (NaN and infinity too)
            raise ValueError(f"--{flag.replace('_', '-')} must be 0 or more (and finite), got {value}")
    if args.fusion_threshold_mb is not None:
        env["COMMLIB_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        env["COMMLIB_CYCLE_TIME"] = repr(args.cycle_time_ms)
    if args.cache_capacity is not None:
        env["COMMLIB_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.disable_cache:
        env["COMMLIB_CACHE_CAPACITY"] = "0"
    if args.timeline_filename:
        env["COMMLIB_TIMELINE"] = os.path.abspath(args.timeline_filename)
    if args.timeline_mark_cycles:
        env["COMMLIB_TIMELINE_MARK_CYCLES"] = "1"
    if args.stall_check_warning_time_seconds is not None:
        env["COMMLIB_STALL_CHECK_TIME"] = str(args.stall_check_warning_time_seconds)
    if args.no_stall_check:
        env["COMMLIB_STALL_CHECK_TIME"] = NO_STALL_CHECK
    if args.stall_check_shutdown_time_seconds is not None:
        env["COMMLIB_TIMEOUT"] = str(args.stall_check_shutdown_time_seconds)
    return env
