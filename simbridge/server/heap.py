"""glibc's malloc told to keep freed memory for reuse, in the processes that carry experience.

A camera's experience is big arrays that live a moment: each fragment's obs and new_obs columns
(200 rows of a 320x240 frame: 46 MB each), a request's frame, the journal's and the learner
pipe's records. glibc serves allocations over its mmap threshold (128 KiB, adapted up to 32 MiB)
with fresh mappings and gives the top of its heap past its trim threshold back to the kernel, so
each such array starts on pages the kernel must fault in and zero again: on the 2-core VM a
quarter of the bridge's work per 320x240 step was that system time, and a Gazebo world with a
320x240 camera stepped 385-430 -> 468-503 times a second, the trainer's CPU a step 1.28-1.51 ->
0.99-1.00 ms (journal off), once the process kept its freed memory (docs/benchmarks.md, "A camera
through Gazebo").

The cost: a process keeps freed memory for reuse instead of returning it (up to TRIM at the top
of each malloc arena; threads may have arenas of their own), so its RSS stays near its peak.
Malloc settings a user made (any MALLOC_* variable, or glibc.malloc tunables in GLIBC_TUNABLES)
are left as they are; SIMBRIDGE_KEEP_FREED_MEMORY=0 keeps glibc's defaults. Elsewhere than glibc
(musl, macOS) this does nothing; a glibc that refuses the mmap threshold is left as it is (the
trim settings alone would freeze glibc's adaptive mmap threshold at 128 KiB, worse than its
default).
"""
import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("simbridge")

MMAP_THRESHOLD = 256 << 20   # arrays under this come from the heap, whose pages stay mapped
TRIM = 256 << 20             # freed heap kept for reuse before the top goes back to the kernel
TOP_PAD = 64 << 20           # the heap grows in steps this much larger (fewer brk calls)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3   # glibc's malloc.h


def _users_own() -> bool:
    return (os.environ.get("SIMBRIDGE_KEEP_FREED_MEMORY", "1") == "0"
            or any(k.startswith("MALLOC_") for k in os.environ)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


def keep_freed_memory() -> bool:
    """Once, early in a process's main. True when glibc took the settings."""
    if _users_own():
        log.debug("malloc: the environment's settings kept")
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # The mmap threshold first: only where glibc takes it may the trim settings follow.
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM)
                and mallopt(_M_TOP_PAD, TOP_PAD))
    log.debug("malloc: freed memory kept for reuse (%s)", "set" if done else "refused")
    return done
