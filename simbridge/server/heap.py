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

The cost: a process holds up to TRIM bytes of freed heap for reuse instead of returning it.
Settings a user made (MALLOC_*_ or GLIBC_TUNABLES in the environment) are left as they are.
Elsewhere than glibc (musl, macOS) this does nothing.
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
_USER_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> bool:
    """Once, early in a process's main. True when glibc took the settings."""
    if any(k in os.environ for k in _USER_SETTINGS):
        log.debug("malloc: the environment's settings kept")
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = all([mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD), mallopt(_M_TRIM_THRESHOLD, TRIM),
                mallopt(_M_TOP_PAD, TOP_PAD)])
    log.debug("malloc: freed memory kept for reuse (%s)", "set" if done else "refused")
    return done
