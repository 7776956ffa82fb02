"""Docs that agree with the tools: the CLI help texts and the docs are searched for claims the code
no longer makes true, and for flags and config keys that do not exist. Where a claim cannot be
checked by text, it is not here; each check below failed on a real stale sentence once."""
import re

import pytest

from simbridge.sims import gym_sim
from simbridge.trainer import cli
from simbridge.trainer import demo
from simbridge.trainer.config.sections import SECTIONS
from simbridge.trainer.run.launch import ROOT

DOCS = sorted([ROOT / "README.md", ROOT / "docker" / "README.md", *(ROOT / "docs").glob("*.md")])


def _help_texts():
    parser = cli.build_parser()
    texts = {"simbridge-trainer --help": parser.format_help()}
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        texts[f"simbridge-trainer {name} --help"] = sub.format_help()
    texts["simbridge-sim --help"] = gym_sim.build_parser().format_help()
    texts["demo docstring"] = demo.__doc__
    return texts


def _texts():
    out = {str(p.relative_to(ROOT)): p.read_text() for p in DOCS}
    out.update(_help_texts())
    return out


# (what was once wrong, a pattern that finds it)
STALE = [
    ("reference simulators exit when the trainer restarts (they reconnect and go on with new episodes)",
     re.compile(r"trainer (?:re)?starts?[^.]*\bthey exit with code 2", re.I | re.S)),
    ("local inference is built (LocalPolicyClient, `--inference local`)",
     re.compile(r"local inference[^.\n]*\bnot (?:yet )?built", re.I)),
    ("a simulator with no trainer is told to start simbridge-trainer, not the random-policy server",
     re.compile(r"no simbridge server answered")),
    ("the progress line shows return(10), the demo's stop metric, not only return(100)",
     re.compile(r"progress line[^.]*return\(100\)")),
]


@pytest.mark.parametrize("truth,pattern", STALE, ids=[t.split(" (")[0][:40] for t, _ in STALE])
def test_no_stale_claims(truth, pattern):
    hits = [f"{name}: {m.group(0)!r}" for name, text in _texts().items() for m in pattern.finditer(text)]
    assert not hits, f"stale (the truth: {truth}):\n" + "\n".join(hits)


def test_documented_trainer_flags_exist():
    parser = cli.build_parser()
    subs = parser._subparsers._group_actions[0].choices
    known = {name: {o for a in sub._actions for o in a.option_strings} for name, sub in subs.items()}
    missing = []
    for name, text in _texts().items():
        for m in re.finditer(r"simbridge-trainer (run|serve|export|plot)\b([^\n`#]*)", text):
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", m.group(2)):
                if flag not in known[m.group(1)]:
                    missing.append(f"{name}: simbridge-trainer {m.group(1)} {flag}")
    assert not missing, "documented flags that do not exist:\n" + "\n".join(missing)


def test_documented_config_keys_exist():
    """`[run] key` and `[server] key` in the docs name fields of those sections."""
    missing = []
    for name, text in _texts().items():
        for section, key in re.findall(r"\[(run|server)\] (\w+)", text):
            if key not in SECTIONS[section].__dataclass_fields__:
                missing.append(f"{name}: [{section}] {key}")
    assert not missing, "documented config keys that do not exist:\n" + "\n".join(missing)
