"""How a bench script ends: its JSON object printed (what a caller pipes or reads), and with --out
the same text in that file, written first (a reader gone from stdout loses nothing); and where a
run's files go meanwhile (`run_dir`)."""
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional


def emit(result: dict, out: Optional[str] = None, indent: Optional[int] = None) -> int:
    """Writes `result` as JSON to `out` (its folder made) when given, prints it; returns 0, the
    script's exit status."""
    text = json.dumps(result, indent=indent)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    print(text, flush=True)
    return 0


@contextlib.contextmanager
def run_dir(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A trainer run's folder in the temp dir (its config, processes.log, logdir), removed at the end
    unless `keep` (a bench's --keep-run-dir: bench/gpu_check.sh collects processes.log). Left
    behind, each bridge run of bench/learning.py kept 0.6-7 MB there."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if keep:
            print(f"run folder kept: {path}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
