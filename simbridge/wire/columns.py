"""Names every room agrees on: experience columns, reserved agent ids, the default policy.

The columns are those of RLlib's SampleBatch: one row per transition, the
observation before (OBS) and after (NEW_OBS) the action.
"""

OBS = "obs"
NEW_OBS = "new_obs"
ACTIONS = "actions"
REWARDS = "rewards"
TERMINATEDS = "terminateds"
TRUNCATEDS = "truncateds"
EPS_ID = "eps_id"
AGENT_INDEX = "agent_index"
T = "t"
POLICY_VERSION = "policy_version"
ACTION_LOGP = "action_logp"
#: Optional column: one info object (usually a dict) per row, a 1-D numpy object array.
INFOS = "infos"

#: The agent id of a single-agent (ExternalEnv) episode.
SINGLE_AGENT_ID = "agent0"
#: The multi-agent key that ends the whole episode, as in RLlib's MultiAgentEnv.
ALL_AGENTS = "__all__"
#: The policy that agents map to when nothing else is said (as in RLlib).
DEFAULT_POLICY = "default_policy"
