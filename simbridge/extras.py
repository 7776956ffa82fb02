"""Console scripts whose optional extra is not installed: one line naming the fix, exit code 2.

`pip install simbridge` is the simulator side; `simbridge-trainer` needs the `trainer` extra
(torch and friends) and `simbridge-unity` the `unity` extra (mlagents-envs). Run without
them, the program says which extra to install instead of ending in a traceback.
"""
import sys
from typing import Callable

#: extra (pyproject's [project.optional-dependencies]) -> (its top-level modules, what to do first)
EXTRAS = {
    "trainer": (frozenset({"torch", "tensorboard", "matplotlib", "onnx"}),
                "install torch first with the build you want (https://pytorch.org/get-started/locally/), "
                "then: "),
    "unity": (frozenset({"mlagents_envs"}), ""),
}


def run_needing_extra(prog: str, extra: str, run: Callable[..., int], *args) -> int:
    """`run(*args)`; if it fails because a module of `extra` is not installed, say so on one
    line and return 2. Any other missing module is a bug and raises as usual."""
    modules, first = EXTRAS[extra]
    try:
        return run(*args)
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in modules:
            raise
        print(f"{prog}: {e.name} is not installed (the {extra} extra): {first}pip install 'simbridge[{extra}]'",
              file=sys.stderr)
        return 2
