"""How a bench script ends: its JSON object printed (what a caller pipes or reads), and with --out
the same text in that file, written first (a reader gone from stdout loses nothing)."""
import json
from pathlib import Path
from typing import Optional


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
