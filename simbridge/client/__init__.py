"""The simulator SDK: clients that call the bridge. Imports ``simbridge.wire`` only (no torch,
no server module)."""
from simbridge.client.policy_client import MultiAgentPolicyClient, PolicyClient, SessionLost

__all__ = ["PolicyClient", "MultiAgentPolicyClient", "SessionLost"]
