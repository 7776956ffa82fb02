"""The simulator SDK: clients that call the bridge. Imports ``simbridge.wire`` only (no torch,
no server module).

    connection.py     the connection engine: channel, session, seq, reconnect, resend
    retry.py          the one retry policy: RETRYABLE codes, Backoff between attempts
    stopping.py       a process that stops (Ctrl-C) waits for no server: stop_waiting, Stopped
    security.py       ClientSecurity: TLS, mutual TLS and the bearer token every client takes
    policy_client.py  PolicyClient, MultiAgentPolicyClient (remote inference), on row_calls.py
                      (their connection, queued rewards and open episodes)
    slot_client.py    SlotClient (a batched simulator: N slots, one Step per step)
    external_env.py   ExternalEnv, ExternalMultiAgentEnv (RLlib's simulator-side classes)
    local_client.py   LocalPolicyClient (local inference), with local_buffer.py (its experience
                      columns), local_uploader.py (its background threads), local_policy.py and
                      local_layers.py (acting with numpy)

The local-inference classes load on first use, so that importing a remote client does not.
"""
import importlib

from simbridge.client.connection import EarlierCallFailed, SessionLost, open_channel
from simbridge.client.policy_client import MultiAgentPolicyClient, PolicyClient
from simbridge.client.security import ClientSecurity

_LAZY = {
    "SlotClient": "simbridge.client.slot_client",
    "ExternalEnv": "simbridge.client.external_env",
    "ExternalMultiAgentEnv": "simbridge.client.external_env",
    "LocalPolicyClient": "simbridge.client.local_client",
    "make_policy_client": "simbridge.client.local_client",
    "LocalPolicy": "simbridge.client.local_policy",
}

__all__ = ["PolicyClient", "MultiAgentPolicyClient", "ClientSecurity", "SessionLost", "EarlierCallFailed",
           "open_channel", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
