"""CartPole-v1 for N slots at once, in numpy, with per-slot auto-reset.

The physics, reward, termination and 500-step limit of gymnasium's
CartPole-v1, stepped for all slots with array operations, so a batched
simulator of hundreds of slots costs microseconds per step (256 gymnasium
envs stepped one by one cost milliseconds). Unlike gymnasium's vector
CartPole (which resets a slot on the step *after* it ended), a slot resets in
the same step, as envrax's BatchedEnv does: step() returns the first
observation of the new episode in `obs` and the last one of the ended episode
in `final_obs`, which is what simbridge's Step carries.
"""
import gymnasium as gym
import numpy as np

GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASS_CART + MASS_POLE
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
THETA_LIMIT = 12 * 2 * np.pi / 360
X_LIMIT = 2.4


class VectorCartPole:
    def __init__(self, num_slots: int, max_episode_steps: int = 500, seed=None):
        self.n = num_slots
        self.max_episode_steps = max_episode_steps
        self.rng = np.random.default_rng(seed)
        # Exactly CartPole-v1's spaces, so both kinds of simulators can feed one policy.
        high = np.array([X_LIMIT * 2, np.inf, THETA_LIMIT * 2, np.inf], np.float32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        # (4, n): each state variable contiguous, updated in place.
        self.state = np.zeros((4, num_slots), np.float64)
        self.steps = np.zeros(num_slots, np.int64)
        self.rewards = np.ones(num_slots, np.float32)

    def _obs(self) -> np.ndarray:
        return self.state.T.astype(np.float32, order="C")

    def reset(self) -> np.ndarray:
        self.state = self.rng.uniform(-0.05, 0.05, (4, self.n))
        self.steps[:] = 0
        return self._obs()

    def step(self, actions):
        """-> obs, rewards, terminated, truncated, final_obs (rows of the ended slots)."""
        x, x_dot, theta, theta_dot = self.state
        force = np.where(np.asarray(actions) == 1, FORCE, -FORCE)
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE / TOTAL_MASS * cos * cos))
        x_acc = temp - POLE_MASS_LENGTH / TOTAL_MASS * theta_acc * cos
        # Euler integration, as gymnasium's default kinematics_integrator (old velocities first).
        x += TAU * x_dot
        x_dot += TAU * x_acc
        theta += TAU * theta_dot
        theta_dot += TAU * theta_acc
        self.steps += 1
        terminated = (np.abs(x) > X_LIMIT) | (np.abs(theta) > THETA_LIMIT)
        truncated = (self.steps >= self.max_episode_steps) & ~terminated
        obs = self._obs()
        done = np.flatnonzero(terminated | truncated)
        final_obs = obs[done]   # a copy: fancy indexing
        if len(done):
            self.state[:, done] = self.rng.uniform(-0.05, 0.05, (4, len(done)))
            self.steps[done] = 0
            obs[done] = self.state[:, done].T
        return obs, self.rewards.copy(), terminated, truncated, final_obs
