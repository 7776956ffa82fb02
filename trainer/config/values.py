"""The trainer config's values: typed checks with "did you mean", `--set KEY=VALUE` overrides,
and the effective config written back as TOML.

Every key is checked against a type: a section's dataclass annotations ([server], [run]) or a
learner's defaults (`policies.<id>.config`). Messages name the key by its dotted path
(`policies.default_policy.config.lr`), the type expected and the value given. Integers are
accepted where a float is expected (TOML's `1` for `1.0`).
"""
import difflib
import json
import re
import typing
from typing import Any, Dict, Iterable, List, Sequence, Tuple, Union

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: the same parser, as a package
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration mistake; the message says how to fix it."""


Override = Tuple[str, Any]   # (dotted key, value)


# ---------------------------------------------------------------- types

def type_name(hint) -> str:
    """How a message names a type: "a float", "an integer", "a list of integers", ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names)
    if origin is typing.Literal:
        return "one of " + ", ".join(toml_value(a) for a in args)
    if origin in (list, List):
        inner = type_name(args[0]) if args else "values"
        return f"a list of {_plural(inner)}"
    if origin in (dict, Dict) or hint is dict:
        return "a table"
    return {bool: "true or false (a boolean)", int: "an integer", float: "a float (a number)",
            str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(name: str) -> str:
    word = name.split(" ", 1)[1] if name.startswith(("a ", "an ")) else name
    word = word.split(" (", 1)[0]
    return word + "s" if not word.endswith("s") else word


def _given(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def check_type(path: str, value, hint):
    """`value` as `hint` wants it (an int where a float is expected becomes a float), or a
    ConfigError naming `path`, the type expected and the value given."""
    if hint is Any or hint is None:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:   # a choice among named values
        if value not in args:
            _mismatch(path, value, hint)
        return value
    if origin is Union:
        for a in args:
            if a is type(None):
                continue
            try:
                return check_type(path, value, a)
            except ConfigError:
                pass
        _mismatch(path, value, hint)
    if origin in (list, List):
        if not isinstance(value, list):
            _mismatch(path, value, hint)
        return [check_type(f"{path}[{i}]", v, args[0]) if args else v for i, v in enumerate(value)]
    if origin in (dict, Dict) or hint is dict:
        if not isinstance(value, dict):
            _mismatch(path, value, hint)
        return value
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, hint)
    if not ok:
        _mismatch(path, value, hint)
    return value


def _mismatch(path: str, value, hint) -> None:
    msg = f"{path} = {toml_value(value)}: expected {type_name(hint)}, got {_given(value)}"
    if isinstance(value, str) and _parses_as(value, hint):
        msg += f"; write it without quotes: {path.rsplit('.', 1)[-1]} = {value}"
    elif isinstance(value, str) and hint is bool:
        msg += "; write true or false without quotes"
    raise ConfigError(msg)


def _parses_as(text: str, hint) -> bool:
    try:
        check_type("", parse_value(text, strict=True), hint)
        return True
    except (ConfigError, ValueError):
        return False


def hint_of_default(default, declared=None):
    """A learner config key's type: declared (for keys whose default is None), else its default's."""
    if declared is not None:
        return declared
    if default is None:
        return Any
    if isinstance(default, list):
        kinds = {type(v) for v in default}
        return List[kinds.pop()] if len(kinds) == 1 else list
    if isinstance(default, dict):
        return dict
    return type(default)


def check_keys(raw: dict, known: Iterable[str], what: str, hint: str = "") -> None:
    """A ConfigError for keys of `raw` not in `known`, with the closest known key suggested."""
    known = sorted(known)
    unknown = sorted(set(raw) - set(known))
    if not unknown:
        return
    guesses = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
    said = "; ".join(f"{k!r}: did you mean {g[0]!r}?" for k, g in guesses.items() if g)
    raise ConfigError(f"{what}: unknown key(s) {unknown}{'; ' + said if said else ''}; known: {known}{hint}")


def check_table_keys(raw: dict, known: Iterable[str], what: str) -> None:
    """check_keys for a table of the config file, where an unknown policies_to_train is most likely
    a top-level key written below a [table] header: the message says so."""
    hint = ""
    if "policies_to_train" in set(raw) - set(known):
        hint = ("; policies_to_train is a top-level key: put it above the first [table] "
                "(TOML files keys that follow a [table] header under that table)")
    check_keys(raw, known, what, hint)


def require_type(value, typ, what: str):
    """`value` if it is a `typ` (dict: a table, list, str), else a ConfigError naming `what`."""
    if not isinstance(value, typ):
        name = {dict: "a table", list: "a list", str: "a string"}.get(typ, typ.__name__)
        raise ConfigError(f"{what} must be {name}, got {value!r}")
    return value


# ---------------------------------------------------------------- overrides

def parse_value(text: str, strict: bool = False):
    """A --set value as TOML reads it (`3e-4`, `true`, `[64, 64]`, `"cpu"`); a bare word that is
    no TOML value is taken as a string (`--set run.device=cpu`) unless strict."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if strict:
            raise ValueError(f"not a TOML value: {text}") from None
        return text


def parse_overrides(specs: Sequence[str]) -> List[Override]:
    """["run.seed=3", ...] -> [("run.seed", 3), ...]."""
    out = []
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {spec!r}: use --set KEY=VALUE with a dotted key, e.g. "
                              f"--set policies.default_policy.config.lr=3e-4")
        text = text.strip()
        try:   # begun as a TOML array, table or string, it is no bare word: strict
            value = parse_value(text, strict=text[:1] in ('[', '{', '"', "'"))
        except ValueError:
            raise ConfigError(f"--set {spec!r}: {text!r} is not a TOML value (an array [1, 2], a table "
                              f"{{a = 1}} or a quoted string \"x\"): close what it opens") from None
        out.append((key, value))
    return out


def apply_overrides(data: dict, overrides: Sequence[Override]) -> None:
    """Set each dotted key in the parsed TOML tables (creating tables on the way); the result
    is then checked like the file."""
    for key, value in overrides:
        parts = key.split(".")
        table = data
        for i, part in enumerate(parts[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parts[:i + 1])} is not a table")
        table[parts[-1]] = value


# ---------------------------------------------------------------- TOML out

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)


def toml_value(v) -> str:
    """One TOML value (inline tables for dicts)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)   # inf, -inf and nan are TOML too
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)   # TOML's basic strings escape as JSON does
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def dump_toml(top: Dict[str, Any], tables: Dict[str, Dict[str, Any]], header: str = "") -> str:
    """Top-level keys, then one [table] per entry (name may be dotted: policies.p0); None values
    are left out (TOML has no null: the default applies)."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{_key(k)} = {toml_value(v)}" for k, v in top.items() if v is not None]
    for name, table in tables.items():
        lines += ["", f"[{'.'.join(_key(p) for p in name.split('.'))}]"]
        lines += [f"{_key(k)} = {toml_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"


def flatten(tables: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """{"run": {"seed": 0}} -> {"run.seed": 0}; lists as their TOML text (for TensorBoard's hparams)."""
    out = {}
    for k, v in tables.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, path + "."))
        elif v is not None:
            out[path] = toml_value(v) if isinstance(v, (list, tuple)) else v
    return out
