"""simbridge/server/heap.py: a serving process keeps freed memory, so a camera's columns reuse
mapped pages instead of faulting fresh ones in; a user's own malloc settings win."""
import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, resource, sys
import numpy as np
from simbridge.server.heap import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "kept" else None
rows = np.random.default_rng(0).integers(0, 256, (8, 240, 320, 3), dtype=np.uint8)
faults = []
for _ in range(12):   # a fragment's obs column of 320x240 frames, made and freed as the bridge does
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    column = np.concatenate([rows] * 25)   # 200 rows: 46 MB
    del column
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"took": took, "faults": sum(faults[2:])}))
"""


def _child(mode: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "SIMBRIDGE_KEEP_FREED_MEMORY")}
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120,
                         env={**base, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_columns_made_again_reuse_their_pages_once_freed_memory_is_kept():
    default, kept = _child("default"), _child("kept")
    assert kept["took"] is True
    # glibc's default maps each 46 MB column afresh: 11,250 faults (520 here, where the kernel maps
    # around each fault), 23 with transparent huge pages always on
    assert default["faults"] >= 10 * 10, default
    assert kept["faults"] < default["faults"] / 10, (kept, default)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_users_own_malloc_settings_are_left_as_they_are():
    assert _child("kept", MALLOC_TRIM_THRESHOLD_="1048576")["took"] is False
    assert _child("kept", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1048576")["took"] is False
    assert _child("kept", MALLOC_ARENA_MAX="2")["took"] is False
    assert _child("kept", SIMBRIDGE_KEEP_FREED_MEMORY="0")["took"] is False
    assert _child("kept", GLIBC_TUNABLES="glibc.rtld.optional_static_tls=2048")["took"] is True
