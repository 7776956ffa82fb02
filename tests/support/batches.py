"""Experience as the bridge hands it to a learner: SampleBatch fragments with the bridge's columns,
acted by the learner under test (its actions, logp and version)."""
import numpy as np

from simbridge.server.sample_batch import SampleBatch
from simbridge.wire import spaces as sb_spaces


def acted_rows(learner, n, version=None, logp=None, eps_id=0, t0=0, rng=None, terminated_at=None):
    """n rows of one episode acted by the learner (its actions and logp unless given)."""
    rng = rng or np.random.default_rng(0)
    now = sb_spaces.sample_batch_of(learner.observation_space, n, rng)
    new = sb_spaces.sample_batch_of(learner.observation_space, n, rng)
    out = learner.compute_actions(now, explore=True)
    term = np.zeros(n, bool)
    if terminated_at is not None:
        term[terminated_at] = True
    return SampleBatch(obs=now, new_obs=new, actions=out.actions,
                       rewards=rng.normal(size=n).astype(np.float32), terminateds=term, truncateds=np.zeros(n, bool),
                       eps_id=np.full(n, eps_id), agent_index=np.zeros(n, np.int64), t=np.arange(t0, t0 + n),
                       policy_version=np.full(n, learner.version if version is None else version),
                       action_logp=out.logp if logp is None else np.full(n, logp, np.float32))
