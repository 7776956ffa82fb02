"""Check the rooms' import contracts (pyproject's [tool.importlinter]) and that no module
import circle exists, on the installed layout.

trainer/ and sims/ install as simbridge.trainer and simbridge.sims, but in the checkout
they sit beside simbridge/, where import-linter (which reads one package folder) would
not see them. So this copies the sources into a temporary tree laid out as a wheel
installs them and lints that.

    python tools/lint_imports.py      # exit 0: every contract kept, no circle
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (source folder in the checkout, where it sits once installed)
LAYOUT = [("simbridge", "simbridge"), ("trainer", "simbridge/trainer"), ("sims", "simbridge/sims")]


def installed_tree(dest: Path) -> Path:
    for src, dst in LAYOUT:
        shutil.copytree(ROOT / src, dest / dst, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.toml"))
    return dest


def import_circles(tree: Path) -> list:
    """Module import circles in simbridge (imports inside functions count too)."""
    import grimp
    graph = grimp.build_graph("simbridge", cache_dir=None)
    import simbridge
    if not Path(simbridge.__file__).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"simbridge was imported from {simbridge.__file__}, not from {tree}")
    edges = {m: {n for n in graph.find_modules_directly_imported_by(m) if n.startswith("simbridge")}
             for m in graph.modules}
    # A package imports its own submodules by being their parent: only explicit imports count.
    return [c for c in _strongly_connected(edges) if len(c) > 1]


def _strongly_connected(edges: dict) -> list:
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):   # Tarjan, recursive: the graph has a few hundred modules at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def check(tree: Path) -> tuple:
    """(report, ok) for an installed-layout tree: the contracts, then any import circle.

    Both run in a fresh interpreter whose path starts at the tree: a process that has
    imported simbridge already would have the graph built from that copy instead."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    run = subprocess.run([sys.executable, __file__, "--tree", str(tree)], cwd=tree, env=env,
                         capture_output=True, text=True)
    return run.stdout[-8000:] + run.stderr[-2000:], run.returncode == 0


def _check_here(tree: Path) -> int:
    from importlinter.cli import lint_imports
    kept = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    circles = import_circles(tree)
    for c in circles:
        print("import circle:", " <-> ".join(c))
    return 0 if kept == 0 and not circles else 1


def main() -> int:
    if sys.argv[1:2] == ["--tree"]:
        return _check_here(Path(sys.argv[2]))
    with tempfile.TemporaryDirectory() as tmp:
        report, ok = check(installed_tree(Path(tmp)))
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
