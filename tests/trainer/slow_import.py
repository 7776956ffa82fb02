"""A module whose import takes as long as the test says, as torch's takes seconds
(tests/trainer/test_learner_process.py): it marks that it is importing, then waits for a go."""
import os
import time
from pathlib import Path

_dir = Path(os.environ["SIMBRIDGE_TEST_SLOW_IMPORT_DIR"])
(_dir / "importing").write_text("")
_deadline = time.monotonic() + 60
while not (_dir / "go").exists() and time.monotonic() < _deadline:
    time.sleep(0.02)


def done() -> None:
    (_dir / "done").write_text("")
