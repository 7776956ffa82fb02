"""Docs that agree with the tools: the CLI help texts and the docs are searched for claims the code
no longer makes true, and for flags and config keys that do not exist. Where a claim cannot be
checked by text, it is not here; each check below failed on a real stale sentence once.

- Stale claims, documented trainer flags and `[run]`/`[server]` keys that do not exist.
- Figures: docs/limits.md's table (every limit of the handshake has a row, each default is the
  dataclass's), any "`key` (FIGURE" or "`key` is FIGURE" in the docs, the prose figures of PROSE, and
  the config docs' `key = value` lines, against BridgeConfig and the trainer's [server], [run] and
  [dataset] sections: a documented limit or default changed in code only fails here.
- docs/architecture.md names every module of simbridge/, trainer/ and sims/ in its folder's
  section (and none that is gone), and every ErrorReason in its error table.
"""
import dataclasses
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
    ("the server's thread pool follows max_concurrent_calls (service.py), no fixed number of workers",
     re.compile(r"\(\d+ worker threads")),
    ("the server serves TLS and authentication beyond loopback (server/security.py)",
     re.compile(r"loopback unless told otherwise, no TLS")),
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


# ---------------------------------------------------------------- figures: documented limits and defaults
# A figure in the docs next to a named key is the code's value: a default changed in code only
# fails here, naming the doc, the key and both values.

BYTES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}
FIGURE = r"(\d[\d,]*(?:\.\d+)?)(?:\s*([KMG]i?B)\b)?"


def _number(text: str, unit: str = None, key: str = "") -> float:
    """'16,384' -> 16384; '64 MiB' -> 67108864 for a *_bytes key, 64 for a *_mb one."""
    value = float(text.replace(",", ""))
    if unit:
        value *= BYTES[unit]
        if key.endswith("_mb"):
            value /= 1 << 20
    return value


def _sources():
    """Where each documented default lives: key -> {source name: value}."""
    from simbridge.client.channels import FAILOVER_AFTER_S
    from simbridge.server.runtime import BridgeConfig
    from simbridge.trainer.config.dataset import DatasetSection
    from simbridge.trainer.config.sections import RunSection, ServerSection
    out = {}
    for cls, name in ((BridgeConfig, "BridgeConfig"), (ServerSection, "server"), (RunSection, "run"),
                      (DatasetSection, "dataset")):
        for f in dataclasses.fields(cls):
            if isinstance(f.default, (int, float)) and not isinstance(f.default, bool):
                out.setdefault(f.name, {})[name] = f.default
    out["FAILOVER_AFTER_S"] = {"client/channels.py": FAILOVER_AFTER_S}
    return out


def _check(doc: str, key: str, figure: float, sources: dict, where: str = None):
    """'' when the figure is the key's value in its source (any source, when the doc names none)."""
    values = sources[key] if where is None else {where: sources[key][where]}
    if any(figure == v for v in values.values()):
        return ""
    return f"{doc}: `{key}` documented as {figure:g}, the code says {values}"


def test_limits_table_figures_are_the_code_defaults():
    """docs/limits.md's table: each row's keys, its Default cell and its Set in cell (BridgeConfig,
    [server], [dataset]) against those dataclasses; every limit of the handshake has a row."""
    from simbridge.wire.v1 import simbridge_pb2 as pb
    sources = _sources()
    text = (ROOT / "docs" / "limits.md").read_text()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| `")]
    named, wrong, checked = set(), [], 0
    for cells in rows:
        keys = [k for k in re.findall(r"`(\w+)`", cells[0]) if k in sources]
        named.update(re.findall(r"`(\w+)`", cells[0]))
        if not keys:
            continue
        default, set_in = cells[2], cells[3]
        for part in default.split(";"):
            where = ("server" if "[server]" in part else "dataset" if "[dataset]" in set_in
                     else "server" if "BridgeConfig" not in set_in else "BridgeConfig")
            figures = [(n, u) for n, u in re.findall(FIGURE, re.sub(r"\([^)]*\)", "", part))]
            assert len(figures) == len(keys), f"docs/limits.md row {cells[0]}: {len(keys)} keys, figures {figures}"
            for key, (n, u) in zip(keys, figures):
                wrong.append(_check("docs/limits.md", key, _number(n, u, key), sources, where))
                checked += 1
    assert checked >= 18, f"only {checked} figures found in docs/limits.md's table: did its layout change?"
    assert not [w for w in wrong if w], "\n".join(w for w in wrong if w)
    missing = {f.name for f in pb.ServerLimits.DESCRIPTOR.fields} - named
    assert not missing, f"limits of the handshake (ServerLimits) without a row in docs/limits.md: {sorted(missing)}"


# "`key` (FIGURE" and "`key` is FIGURE" anywhere in the docs; "`[server] key` (FIGURE" picks the section.
KEY_FIGURE = re.compile(r"`(?:\[(\w+)\] )?(\w+)`(?: \(| is )~?" + FIGURE)


def test_figures_next_to_a_key_are_its_default():
    sources = _sources()
    wrong, checked = [], 0
    for name, text in _texts().items():
        for section, key, n, unit in KEY_FIGURE.findall(text):
            if key not in sources or (section and section not in sources[key]):
                continue
            wrong.append(_check(name, key, _number(n, unit, key), sources, section or None))
            checked += 1
    assert checked >= 10, f"only {checked} documented figures found"
    assert not [w for w in wrong if w], "\n".join(w for w in wrong if w)


def _learner_default(key, *tables):
    """A learner's default as `config_defaults()` merges it ({**COMMON_DEFAULTS, **DEFAULTS}), read
    from the modules' literal dicts: importing a learner costs torch (seconds on a loaded machine)."""
    import ast

    def value():
        merged = {}
        for module, name in tables:
            tree = ast.parse((ROOT / "trainer" / "learners" / module).read_text())
            node = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                        and [getattr(target, "id", None) for target in n.targets] == [name])
            merged.update(ast.literal_eval(node))
        return merged[key]
    return value


_dqn_buffer = _learner_default("buffer_size", ("base.py", "COMMON_DEFAULTS"), ("dqn.py", "DQN_DEFAULTS"))
_sac_initial_alpha = _learner_default("initial_alpha", ("base.py", "COMMON_DEFAULTS"), ("sac.py", "SAC_DEFAULTS"))


def _bridge(key):
    from simbridge.server.runtime import BridgeConfig
    return lambda: getattr(BridgeConfig, key)


def _ring_bytes():
    from simbridge.wire.shm_ring import DEFAULT_RING_BYTES
    return DEFAULT_RING_BYTES


def _wire(name):
    def value():
        from simbridge.wire import spaces, tensors
        return getattr(tensors, name, None) or getattr(spaces, name)
    return value


def _sessions(name):
    def value():
        from simbridge.server import sessions
        return getattr(sessions, name)
    return value


def _grpc_workers():
    return (ROOT / "simbridge" / "server" / "service.py").read_text()


# Figures in prose, each next to the words that name it: (file, pattern whose group 1 is the
# figure, the code's value). A figure the patterns above cannot attribute goes here.
PROSE = [
    ("docs/limits.md", r"(\d[\d,]*) x ~400 B", _bridge("finished_ids_kept")),
    ("docs/limits.md", r"(\d[\d,]*) x ~500 B", _bridge("max_open_episodes_per_session")),
    ("docs/limits.md", r"(\d[\d,]*) sessions x \(", _bridge("max_sessions_per_client")),
    ("docs/limits.md", r"sessions x \((\d+ MiB)", _bridge("response_cache_bytes")),
    ("docs/limits.md", r"`(\d+ GiB) \+ \d+ sessions", _bridge("max_client_state_bytes")),
    ("docs/limits.md", r"from 1,000 to (\d[\d,]*) \(issue 13", _bridge("finished_ids_kept")),
    ("docs/limits.md", r"`max_sessions_per_client` went from 1,024 to (\d[\d,]*)", _bridge("max_sessions_per_client")),
    ("docs/limits.md", r"the default DQN \((\d[\d,]*) transitions\)", _dqn_buffer),
    ("docs/limits.md", r"\| shared-memory ring[^\n]*?\| (\d+ MiB) \|", _ring_bytes),
    ("docs/limits.md", r"a tensor: (\d+) \(numpy", _wire("MAX_DIMS")),
    ("docs/limits.md", r"a space leaf: (\d+) \(", _wire("MAX_LEAF_DIMS")),
    ("docs/limits.md", r"action elements\)\s+\+ (\d+ KiB)`", _sessions("EPISODE_OVERHEAD_BYTES")),
    ("docs/architecture.md", r"remembered as finished \(the last `finished_ids_kept` \((\d[\d,]*)\)", _bridge("finished_ids_kept")),
    ("docs/architecture.md", r"finished ids remembered up to (\d[\d,]*) per session", _bridge("finished_ids_kept")),
    ("trainer/configs/unity_3dball.toml", r"SAC's own default is (\d+(?:\.\d+)?)", _sac_initial_alpha),
    ("trainer/configs/unity_peer.toml", r"keeps SAC's defaults\s*#?\s*\(initial_alpha (\d+(?:\.\d+)?)", _sac_initial_alpha),
]


@pytest.mark.parametrize("doc, pattern, truth", PROSE, ids=[f"{d}:{p[:30]}" for d, p, _ in PROSE])
def test_prose_figures_are_the_code_values(doc, pattern, truth):
    m = re.search(pattern, (ROOT / doc).read_text())
    assert m, f"{doc} no longer says {pattern!r}: update the doc, or this table"
    n, _, unit = m.group(1).partition(" ")
    assert _number(n, unit or None, "_bytes" if unit else "") == truth(), \
        f"{doc}: {m.group(0)!r}, the code says {truth()}"


def test_architecture_states_the_grpc_thread_pool_as_built():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(r"a pool of `max_concurrent_calls` \+ (\d+) worker threads", doc)
    assert m, "docs/architecture.md no longer sizes the server's thread pool"
    assert f"max_workers=c.max_concurrent_calls + {m.group(1)}" in _grpc_workers(), \
        "simbridge/server/service.py sizes its thread pool otherwise than docs/architecture.md says"


# The config docs (module docstrings showing a section's keys) state defaults as `key = value`;
# a comment with "default X" states X instead, and "optional" or "default:" in words is no figure.
CONFIG_DOCS = [ROOT / "trainer" / "config" / "trainer_config.py", ROOT / "trainer" / "data" / "datasets.py"]


def test_config_docs_state_the_section_defaults():
    import ast
    import tomllib
    from simbridge.trainer.config.dataset import DatasetSection
    defaults = {**SECTIONS, "dataset": DatasetSection}
    wrong, checked = [], 0
    for path in CONFIG_DOCS:
        section = None
        for line in ast.get_docstring(ast.parse(path.read_text())).splitlines():
            line = line.strip()
            head = re.match(r"\[([\w.]+)\]", line)
            if head:
                section = head.group(1)
                continue
            m = re.match(r"(\w+) = ([^#]+?)\s*(?:#\s*(.*))?$", line)
            if not m or section not in defaults:
                continue
            key, value, comment = m.group(1), m.group(2), m.group(3) or ""
            stated = re.search(r"\(default ([\w.\"]+)\)", comment)
            if stated:
                value = stated.group(1)
            elif "optional" in comment or "default" in comment:
                continue
            value = tomllib.loads(f"v = {value}")["v"]
            if isinstance(value, (dict, list)):
                continue   # an example, not a default
            field = defaults[section].__dataclass_fields__.get(key)
            if field is None:
                wrong.append(f"{path.name}: [{section}] {key} is no key of that section")
            elif value != field.default:
                wrong.append(f"{path.name}: [{section}] {key} = {value!r}, the default is {field.default!r}")
            checked += 1
    assert checked >= 15, f"only {checked} keys found in the config docs"
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------- architecture.md names every module

ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROOMS = ("simbridge", "trainer", "sims")


def _modules():
    """Hand-written Python modules by folder: {'trainer/learners': ['dqn.py', ...]}."""
    out = {}
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name == "__init__.py" or "_pb2" in path.name or "__pycache__" in rel.parts:
                continue
            out.setdefault(str(rel.parent), []).append(path.name)
    return out


def _sections():
    """architecture.md cut at its headings: {folder: text} for each heading that names `folder/`."""
    out, folder = {}, None
    for line in ARCHITECTURE.read_text().splitlines():
        if line.startswith("#"):
            m = re.search(r"`((?:simbridge|trainer|sims)(?:/\w+)*)/`", line)
            folder = m.group(1) if m else None
            continue
        if folder:
            out[folder] = out.get(folder, "") + line + "\n"
    return out


def test_architecture_names_every_module_in_its_folders_section():
    sections, missing = _sections(), []
    for folder, names in _modules().items():
        if folder not in sections:
            missing.append(f"{folder}/ (no heading naming `{folder}/`)")
            continue
        missing += [f"{folder}/{n}" for n in names if f"`{n}`" not in sections[folder]]
    assert not missing, "modules docs/architecture.md does not name, with a one-line job:\n" + "\n".join(missing)


def test_architecture_tables_name_no_module_that_is_gone():
    modules, gone = _modules(), []
    for folder, text in _sections().items():
        for line in text.splitlines():
            m = re.match(r"\| ((?:`\w+\.py`(?:, )?)+) \|", line)
            if m:
                gone += [f"{folder}/{n}" for n in re.findall(r"`(\w+\.py)`", m.group(1))
                         if n not in modules.get(folder, [])]
    assert not gone, "docs/architecture.md's tables name modules that do not exist:\n" + "\n".join(gone)


def test_architecture_names_every_public_cpp_header():
    doc = ARCHITECTURE.read_text()
    headers = sorted(p.name for p in (ROOT / "sims" / "cpp" / "include" / "simbridge").glob("*.hpp"))
    missing = [h for h in headers if f"`{h}`" not in doc and f"<simbridge/{h}>" not in doc]
    assert headers and not missing, f"C++ SDK headers docs/architecture.md does not name: {missing}"


def test_architecture_error_table_names_every_error_reason():
    from simbridge.wire.v1 import simbridge_pb2 as pb
    doc = ARCHITECTURE.read_text()
    table = "\n".join(line for line in doc.splitlines() if line.startswith("| ") and "`" in line)
    missing = [r for r in pb.ErrorReason.keys() if r != "ERROR_REASON_UNSPECIFIED" and f"`{r}`" not in table]
    assert not missing, f"ErrorReasons docs/architecture.md's error table leaves out: {missing}"


def test_trainer_doc_tables_hold_every_key_with_its_default():
    """docs/trainer.md's `[server]` and `[run]` tables: a row per key of the section, its default
    as a TOML value (or "unset" for None) equal to the dataclass's."""
    import tomllib
    text = (ROOT / "docs" / "trainer.md").read_text()
    wrong = []
    for section, cls in SECTIONS.items():
        m = re.search(rf"^### `\[{section}\]`.*?\n(.*?)(?=^#)", text, re.S | re.M)
        assert m, f"docs/trainer.md has no '### `[{section}]`' table"
        rows = {}
        for line in m.group(1).splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| `") and len(cells) >= 2:
                for key in re.findall(r"`(\w+)`", cells[0]):
                    rows[key] = cells[1]
        for f in dataclasses.fields(cls):
            if f.name not in rows:
                wrong.append(f"[{section}] {f.name}: no row")
                continue
            cell = rows.pop(f.name)
            stated = None if cell == "unset" else tomllib.loads(f"v = {cell.strip('`')}")["v"]
            if stated != f.default:
                wrong.append(f"[{section}] {f.name}: documented {cell}, the default is {f.default!r}")
        wrong += [f"[{section}] {key}: a row for no key of the section" for key in rows]
    assert not wrong, "docs/trainer.md's config tables disagree with trainer/config/sections.py:\n" + "\n".join(wrong)


# ---------------------------------------------------------------- the README stays a five-minute read

README_MAX_BYTES = 10_000   # ~1,400 words; details go to docs/ (trainer.md, python-sdk.md, ...)


def test_readme_is_a_short_path_to_every_doc():
    """What it is, the two commands, the simulator loop, `simbridge-trainer run`, in that order and
    near the top; then a link to every docs/ page, so a page moved out of the README stays found."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= README_MAX_BYTES, \
        f"README.md is {len(text.encode())} bytes (at most {README_MAX_BYTES}): move the details into docs/"
    marks = ["make demo", "from simbridge.client import PolicyClient", "simbridge-trainer run"]
    at = [text.find(m) for m in marks]
    assert -1 not in at and at == sorted(at) and at[-1] < len(text) // 2, \
        f"README.md should show {marks} in that order, in its first half: found at {at}"
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{p.name})" not in text]
    assert not unlinked, f"docs/ pages README.md does not link to: {unlinked}"
