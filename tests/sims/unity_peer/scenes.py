"""Small scenes for the Unity test peer, one behavior each, in numpy.

A scene owns its agents' state and answers what a Unity Agent would: its
observations, its action mask, what an action does (reward, terminal). The
peer (peer.py) adds what the ML-Agents package does around it: max steps,
decision periods, the wire messages.

  ball     "Ball"    a ball on a tilting plate, 1-D (3DBall's idea): observation
                     [position, velocity], actions Discrete(3) (tilt left, none,
                     right). +0.1 per step alive, the episode ends (terminal)
                     when the ball leaves [-1, 1]; max step 100 (interrupted).
                     A random policy keeps it ~25 steps; DQN learns to hold it.
  reach    "Reach"   1-D reach: observation [x, goal], action Box(1) moves x by
                     0.25 a; reward -|x - goal|, +1 and terminal within 0.1.
  goal     "Goal"    sparse goal reaching, 1-D: observation [x, goal], action Box(1)
                     moves x by 0.2 a (x kept in [-2, 2]); x starts at 0, the goal
                     1 to its left or right. -0.01 per step, +1 and terminal within
                     0.1 of the goal (5 steps at best: 0.95); max step 50
                     (interrupted). Random: about -0.2 (most episodes run out).
  camera   "Camera"  visual observation only (C x H x W or H x W x C), actions
                     Discrete(3) moving a marker left/stay/right; terminal on the
                     middle column. Pixel values are integers / 255, so PNG and
                     float transport give the same numbers.
  hybrid   "Hybrid"  observation [id, t, 1], actions 1 continuous + branches (3, 2);
                     discrete action 2 on branch 0 ends the episode.
  masked   "Masked"  observation [t, id], branches (4, 3) with masks that change
                     every step; a masked action costs -1 (and is counted).
  group    "Group"   agents in groups 1 and 2 (SimpleMultiAgentGroup); each step
                     a group reward of 0.5 * group id, and the whole group ends
                     together every 4 steps with a group reward of 1.
"""
from typing import List, Optional, Tuple

import numpy as np

# DimensionProperty values on the wire.
NONE, TRANSLATIONAL_EQUIVARIANCE = 1, 2


class ObsSpec:
    def __init__(self, shape, dim_props, visual: bool = False):
        self.shape = tuple(shape)
        self.dim_props = list(dim_props)
        self.visual = visual


def vector(n: int) -> ObsSpec:
    return ObsSpec((n,), [NONE])


class Scene:
    behavior = "Scene"
    continuous = 0
    branches: Tuple[int, ...] = ()
    max_step = 0
    obs_specs: List[ObsSpec] = []

    def __init__(self, n_agents: int, rng: np.random.Generator, opts):
        self.n = n_agents
        self.rng = rng
        self.opts = opts
        self.t = np.zeros(n_agents, np.int64)   # steps in the current episode

    def reset(self, i: int) -> None:
        self.t[i] = 0

    def observe(self, i: int) -> List[np.ndarray]:
        raise NotImplementedError

    def mask(self, i: int) -> Optional[List[bool]]:
        """True = masked, branches side by side; None: no mask sent."""
        return None

    def act(self, i: int, cont: np.ndarray, disc: np.ndarray) -> Tuple[float, bool]:
        """One tick with this action: (reward, terminal)."""
        raise NotImplementedError

    def group_id(self, i: int) -> int:
        return 0

    def group_reward(self, i: int) -> float:
        return 0.0

    def group_end(self, i: int) -> bool:
        return False


class Ball(Scene):
    behavior = "Ball"
    branches = (3,)
    max_step = 100
    obs_specs = [vector(2)]
    DT, PUSH, NOISE = 0.1, 1.0, 0.3

    def __init__(self, n_agents, rng, opts):
        super().__init__(n_agents, rng, opts)
        self.pos = np.zeros(n_agents)
        self.vel = np.zeros(n_agents)

    def reset(self, i):
        super().reset(i)
        self.pos[i] = self.rng.uniform(-0.3, 0.3)
        self.vel[i] = self.rng.uniform(-0.3, 0.3)

    def observe(self, i):
        return [np.array([self.pos[i], self.vel[i]], np.float32)]

    def act(self, i, cont, disc):
        push = (int(disc[0]) - 1) * self.PUSH
        self.vel[i] += self.DT * (push + self.NOISE * self.rng.standard_normal()) + 0.02 * np.sign(self.pos[i])
        self.pos[i] += self.DT * self.vel[i]
        fell = abs(self.pos[i]) > 1.0
        return (0.0 if fell else 0.1), bool(fell)


class Reach(Scene):
    behavior = "Reach"
    continuous = 1
    max_step = 20
    obs_specs = [vector(2)]

    def __init__(self, n_agents, rng, opts):
        super().__init__(n_agents, rng, opts)
        self.x = np.zeros(n_agents)
        self.goal = np.zeros(n_agents)

    def reset(self, i):
        super().reset(i)
        self.x[i] = self.rng.uniform(-1, 1)
        self.goal[i] = self.rng.uniform(-1, 1)

    def observe(self, i):
        return [np.array([self.x[i], self.goal[i]], np.float32)]

    def act(self, i, cont, disc):
        self.x[i] = np.clip(self.x[i] + 0.25 * float(np.clip(cont[0], -1, 1)), -1.5, 1.5)
        dist = abs(self.x[i] - self.goal[i])
        if dist < 0.1:
            return 1.0, True
        return -float(dist), False


class Goal(Scene):
    """The common Unity / robotics reward shape: a small step penalty, +1 at the goal. A
    temperature large against these rewards makes wandering worth more than arriving."""
    behavior = "Goal"
    continuous = 1
    max_step = 50
    obs_specs = [vector(2)]
    SPEED, RADIUS, STEP_PENALTY = 0.2, 0.1, 0.01

    def __init__(self, n_agents, rng, opts):
        super().__init__(n_agents, rng, opts)
        self.x = np.zeros(n_agents)
        self.goal = np.zeros(n_agents)

    def reset(self, i):
        super().reset(i)
        self.x[i] = 0.0
        self.goal[i] = self.rng.choice([-1.0, 1.0])

    def observe(self, i):
        return [np.array([self.x[i], self.goal[i]], np.float32)]

    def act(self, i, cont, disc):
        self.x[i] = np.clip(self.x[i] + self.SPEED * float(np.clip(cont[0], -1, 1)), -2.0, 2.0)
        if abs(self.x[i] - self.goal[i]) < self.RADIUS:
            return 1.0, True
        return -self.STEP_PENALTY, False


class Camera(Scene):
    behavior = "Camera"
    branches = (3,)
    max_step = 8
    SIZE = 5

    def __init__(self, n_agents, rng, opts):
        super().__init__(n_agents, rng, opts)
        c, s = opts.channels, self.SIZE
        if opts.visual_layout == "chw":
            spec = ObsSpec((c, s, s), [NONE, TRANSLATIONAL_EQUIVARIANCE, TRANSLATIONAL_EQUIVARIANCE], True)
        else:
            spec = ObsSpec((s, s, c), [TRANSLATIONAL_EQUIVARIANCE, TRANSLATIONAL_EQUIVARIANCE, NONE], True)
        if not opts.dimension_properties:
            spec.dim_props = []
        self.obs_specs = [spec]
        self.col = np.zeros(n_agents, np.int64)

    def reset(self, i):
        super().reset(i)
        self.col[i] = int(self.rng.choice([0, 1, 3, 4]))

    def image_hwc(self, i) -> np.ndarray:
        """uint8 (H, W, C): a pattern that differs per channel, row, column, agent and step."""
        s, c = self.SIZE, self.opts.channels
        ch, h, w = np.meshgrid(np.arange(c), np.arange(s), np.arange(s), indexing="ij")
        img = (37 * ch + 11 * h + 5 * w + 7 * i + 3 * self.t[i] + 1) % 200 + 20
        img[:, :, self.col[i]] = 255  # the marker column
        return img.transpose(1, 2, 0).astype(np.uint8)

    def observe(self, i):
        hwc = self.image_hwc(i).astype(np.float32) / np.float32(255.0)
        return [hwc.transpose(2, 0, 1) if self.opts.visual_layout == "chw" else hwc]

    def act(self, i, cont, disc):
        self.col[i] = int(np.clip(self.col[i] + int(disc[0]) - 1, 0, self.SIZE - 1))
        if self.col[i] == self.SIZE // 2:
            return 1.0, True
        return -0.1, False


class Hybrid(Scene):
    behavior = "Hybrid"
    continuous = 1
    branches = (3, 2)
    max_step = 5
    obs_specs = [vector(3)]

    def observe(self, i):
        return [np.array([i, self.t[i], 1.0], np.float32)]

    def act(self, i, cont, disc):
        reward = -abs(float(cont[0]) - 0.5) + (1.0 if disc[0] == 1 else 0.0) + (0.5 if disc[1] == 0 else 0.0)
        return reward, bool(disc[0] == 2)


class Masked(Scene):
    behavior = "Masked"
    branches = (4, 3)
    max_step = 6
    obs_specs = [vector(2)]

    def observe(self, i):
        return [np.array([self.t[i], i], np.float32)]

    def mask(self, i):
        """Branch 0: two of four actions masked, changing every step; branch 1: action 0 on even steps."""
        t = int(self.t[i])
        m0 = [False] * 4
        m0[(t + i) % 4] = True
        m0[(t + i + 1) % 4] = True
        m1 = [t % 2 == 0, False, False]
        return m0 + m1

    def act(self, i, cont, disc):
        m = self.mask(i)
        bad = m[int(disc[0])] or m[4 + int(disc[1])]
        return (-1.0 if bad else 0.1), False


class Group(Scene):
    behavior = "Group"
    branches = (2,)
    max_step = 50
    obs_specs = [vector(2)]

    def observe(self, i):
        return [np.array([i, self.t[i]], np.float32)]

    def group_id(self, i):
        return 1 if i < self.n // 2 else 2

    def act(self, i, cont, disc):
        return 0.1 * int(disc[0]), False

    def group_reward(self, i):
        return (1.0 if self.group_end(i) else 0.5 * self.group_id(i))

    def group_end(self, i):
        return self.t[i] > 0 and self.t[i] % 4 == 0


SCENES = {"ball": Ball, "reach": Reach, "goal": Goal, "camera": Camera, "hybrid": Hybrid, "masked": Masked, "group": Group}
