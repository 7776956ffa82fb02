"""What a real server collected, read back in the semantics tests, and the small observations
those tests send (Box(2,): [x, -x])."""
import numpy as np

from simbridge.server.sample_batch import MultiAgentBatch

# The two ways a Python client carries its calls: one bidirectional Stream, or a unary RPC each.
TRANSPORTS = ["stream", "unary"]


def collected(server) -> MultiAgentBatch:
    """Everything the server collected so far (open fragments flushed), taken from its queue."""
    server.runtime.flush()
    return MultiAgentBatch.concat_samples(server.runtime.experience.get_all())


def o(x):
    return np.array([x, -x], np.float32)
