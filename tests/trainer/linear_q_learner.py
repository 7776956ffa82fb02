"""A tiny Learner for the trainer daemon's tests: linear Q-values, epsilon-greedy.

Importable by a daemon subprocess as `algorithm = "linear_q_learner:LinearQLearner"`
with tests/ on PYTHONPATH, so the daemon's tests need neither DQN nor SAC.
"""
import numpy as np
import torch

from simbridge.trainer.learners.base import Learner
from simbridge.wire.preprocess import flat_dim


class LinearQLearner(Learner):
    DEFAULTS = {"lr": 1e-2, "epsilon": 0.2}

    def build(self) -> None:
        self.q = torch.nn.Linear(flat_dim(self.observation_space), int(self.action_space.n)).to(self.device)

    def modules_for_acting(self) -> torch.nn.Module:
        return self.q

    def act(self, module, obs, explore):
        greedy = module(obs).argmax(dim=1).cpu().numpy()
        if explore:
            rand = self.rng.random(len(greedy)) < self.config["epsilon"]
            greedy = np.where(rand, self.rng.integers(self.action_space.n, size=len(greedy)), greedy)
        return greedy.astype(np.int64) + int(self.action_space.start), None

    def store_actions(self, actions):
        return np.asarray(actions, np.int64) - int(self.action_space.start)

    def update(self, batch):
        q = self.q(batch["obs"]).gather(1, batch["actions"].long().view(-1, 1)).squeeze(1)
        with torch.no_grad():
            target = batch["rewards"] + batch["discounts"] * self.q(batch["new_obs"]).max(dim=1).values
        loss = torch.nn.functional.mse_loss(q, target)
        self.q.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():   # plain SGD by hand: torch.optim's first use imports torch._dynamo, seconds
            for p in self.q.parameters():   # of every learner process these tests start
                p.add_(p.grad, alpha=-self.config["lr"])
        return {"loss": float(loss)}
