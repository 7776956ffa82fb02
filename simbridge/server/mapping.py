"""Policy mapping functions: which policy an agent acts with.

The runtime calls `fn(agent_id, episode)` once per agent and episode, on the
agent's first observation, and keeps the answer for the rest of the episode.
"""
import fnmatch
from typing import Callable, List, Sequence, Tuple

from simbridge.wire.columns import DEFAULT_POLICY


def parse_rules(specs: Sequence[str]) -> List[Tuple[str, str]]:
    """'PATTERN=POLICY' strings (shell-style globs on agent ids) into rules."""
    rules = []
    for spec in specs:
        pattern, sep, policy = spec.partition("=")
        if not sep or not pattern or not policy:
            raise ValueError(f"policy map {spec!r} is not PATTERN=POLICY (e.g. 'player_*=nim')")
        rules.append((pattern, policy))
    return rules


def pattern_mapping(rules: Sequence[Tuple[str, str]], default: str = DEFAULT_POLICY) -> Callable:
    """The first rule whose glob matches the agent id wins; else `default`."""
    rules = list(rules)

    def fn(agent_id: str, episode=None) -> str:
        for pattern, policy in rules:
            if fnmatch.fnmatchcase(agent_id, pattern):
                return policy
        return default

    return fn
