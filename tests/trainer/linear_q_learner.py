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
        self.opt = torch.optim.SGD(self.q.parameters(), lr=self.config["lr"])

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
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return {"loss": float(loss)}
