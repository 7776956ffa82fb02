"""`simbridge-unity`: Unity ML-Agents builds (or the Editor) as simbridge simulators.

Importing this package installs `compat`'s import hook, so mlagents-envs 0.28.0
loads with the project's protobuf. The modules:

  * compat      rebuilds mlagents_envs' old generated _pb2 modules
  * observations decodes ObservationProtos (float or PNG, CHW or HWC) and AgentInfos into steps
  * environment  UnityEnvironment with that decoding, the handshake's versions, clear timeouts
  * spaces       BehaviorSpec -> gymnasium spaces; steps -> observations; actions -> ActionTuple
  * behavior     one behavior's agents as simbridge episodes (one batched call per step)
  * connector    the CLI: instances, side channels, budgets, summaries
  * program      the console script: the connector, or the `unity` extra named when missing
"""
from simbridge.sims.unity import compat

compat.install()
