"""Data-parallel training on torch.distributed: one trainer rank per process, on as many hosts as
the group has (docs/scaling.md).

Each rank is a whole `simbridge-trainer run`: its own bridge server on its own address, its own
simulators, its own replay shard. What the ranks share is decided in one collective per pass of
the learning loop, the *exchange*: an all_gather of a small vector from every rank (a stop
request, the env steps, agent steps and episodes counted since the last exchange, for each
policy whether it exists here, the rows fed to it and its replay size, and the episodes that
ended). From it every rank computes the same decision:

- stop: when any rank asks (a signal) or the group's env steps reach total_env_steps; every
  rank leaves the loop at the same exchange, so no rank waits in a collective for one gone;
- the replay ratio's clock, per policy: the group's rows / world size (rows per rank on
  average), so `updates_per_step` means what it means on one process, with each update's
  batch drawn on every rank (a global batch of world x batch_size);
- how many updates to run now: the learner's own rule (its `_update_target` on that clock, less
  the updates done), once one rank holds a batch. Every rank runs them, so every all_reduce has
  all its ranks: a rank whose shard is still smaller than a batch (no simulator yet) runs them
  on filler rows (one row sent once by the fullest rank) with weight 0, and the average is over
  the ranks with data;
- PPO (on-policy, `ON_POLICY`): no replay ratio; an iteration starts on every rank at the same
  exchange once the group's waiting rows reach world x train_batch_size, with the same number of
  minibatch updates everywhere (Group.train_iteration), each rank on its own rows;
- on rank 0, the other ranks' counts and episode summaries, folded into its runtime's metrics:
  rank 0's progress lines, metrics.jsonl, TensorBoard and checkpoint are the group's.

The updates themselves run in every rank in the same order, and each optimizer step first
averages the gradients of its parameters over the ranks (one all_reduce of the flattened
gradients): the weights stay bitwise equal, and the version (the update count) too. When a
policy first exists on some rank (the config's spaces, a resumed checkpoint, or a simulator's
handshake), rank 0 (or the first rank that has it) broadcasts its spaces, networks, optimizers
and counts (torch.save bytes, read back with the safe loader); the other ranks build it from
them, so the ranks start equal.

The learners train in the loop's own thread here (`learner_process` is forced off): the
collectives must be issued by every rank in the same order at the points the exchange decides,
and the loop that makes the decision is the one place that can issue them without a second
hand-over to a child process per update. The journal is off in a group: a resume restarts from
rank 0's checkpoint. [dataset]: each rank records its own simulators' episodes (its own dataset ids,
datasets.dataset_id), and a warm start gives each rank every world-th episode of the dataset; its
rows count on the group's clock (DistributedLoop.run).
"""
import hashlib
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from simbridge.trainer.run.checkpoint import state_bytes, state_from_bytes
from simbridge.trainer.learners import optim
from simbridge.trainer.learners.base import Learner, trains
from simbridge.trainer.distributed.ranks import RankInfo, lost

MAX_EPISODES = 32      # episode summaries one rank sends per exchange (the rest go in the next)


class Share:
    """What this rank's next updates weigh: 1 with its own samples, 0 with filler rows (a rank
    whose shard is still smaller than a batch); `ready`: the ranks that weigh 1."""
    weight = 1.0
    ready = 1


def average_gradients(learner: Learner, share: Share) -> None:
    """Makes each optimizer of the learner average its parameters' gradients over the ranks that
    have data before it steps. Every rank steps the same optimizers in the same order (same code,
    same decisions), so the all_reduces pair up; the sum is the same tensor on every rank."""
    for obj in list(vars(learner).values()):
        if not isinstance(obj, optim.STEPPING) or getattr(obj, "_simbridge_averaged", False):
            continue
        step = obj.step

        def averaged(*args, _step=step, _opt=obj, **kwargs):
            grads = [p.grad for g in _opt.param_groups for p in g["params"] if p.grad is not None]
            if grads:
                flat = torch._utils._flatten_dense_tensors(grads)
                if share.weight == 0.0:   # filler rows: nothing of theirs counts (not even a NaN)
                    flat.zero_()
                dist.all_reduce(flat)
                flat /= share.ready
                for g, v in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                    g.copy_(v)
            return _step(*args, **kwargs)
        obj.step = averaged
        obj._simbridge_averaged = True


def weights_digest(learner: Learner) -> str:
    """A short hash of the learner's networks (not its optimizers): equal on every rank of a group."""
    h = hashlib.sha256()
    for name, obj in sorted(vars(learner).items()):
        if isinstance(obj, torch.nn.Module) and name != "acting":
            for key, t in sorted(obj.state_dict().items()):
                h.update(key.encode())
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Group:
    """The exchange: one all_gather per loop pass, and what every rank derives from it."""

    def __init__(self, info: RankInfo, runtime, policy_ids: List[str], comm_device: torch.device):
        self.info = info
        self.runtime = runtime
        self.pids = list(policy_ids)
        self.device = comm_device
        self.entry = 3 + 2 * len(self.pids)   # total reward, length, evaluation, per policy (sum, agents)
        self.head = 5 + 3 * len(self.pids)
        self.sent = {"env": 0, "agent": 0}           # this rank's counts already sent
        self.remote = {"env": 0, "agent": 0, "episodes": 0}   # rank 0: what the others' sent, folded in
        self.fed: Dict[str, int] = {pid: 0 for pid in self.pids}         # rows fed here since the last exchange
        self.group_fed: Dict[str, int] = {pid: 0 for pid in self.pids}   # the group's, since the start
        self.base: Dict[str, int] = {}     # per policy: rank 0's agent steps when the loop started (resume)
        self.synced: set = set()
        self.share = Share()
        self.filler: Dict[str, dict] = {}   # per policy: one replay row, shapes for a rank without data
        self.iteration_share: Dict[str, tuple] = {}   # per PPO policy: (weight, ready) of its iteration
        self.env_steps = 0                 # the group's, as of the last exchange
        self.rows: Dict[str, List[int]] = {}   # per policy: each rank's waiting_rows()
        self.has: Dict[str, List[bool]] = {}   # per policy: which ranks have it
        self.episodes: List[dict] = []     # ended here, not yet sent (ranks other than 0)
        if not info.writes:
            runtime.episode_end_callbacks.append(self.episodes.append)   # runtime lock held

    def _vector(self, stop: bool) -> torch.Tensor:
        m, policies = self.runtime.metrics, self.runtime.policies
        with self.runtime.ctx.lock:
            env = m.env_steps - self.remote["env"]
            agent = m.agent_steps - self.remote["agent"]
            send, self.episodes[:] = self.episodes[:MAX_EPISODES], self.episodes[MAX_EPISODES:]
            left = len(self.episodes)
        v = torch.zeros(self.head + MAX_EPISODES * self.entry, dtype=torch.float64)
        v[:5] = torch.tensor([float(stop), env - self.sent["env"], agent - self.sent["agent"], len(send), left],
                             dtype=torch.float64)
        self.sent = {"env": env, "agent": agent}
        for i, pid in enumerate(self.pids):
            p = policies.get(pid)
            v[5 + 3 * i:8 + 3 * i] = torch.tensor([p is not None, self.fed[pid], p.waiting_rows() if _learns(p) else 0],
                                                  dtype=torch.float64)
            self.fed[pid] = 0
        for j, s in enumerate(send):
            e = v[self.head + j * self.entry:self.head + (j + 1) * self.entry]
            e[0], e[1], e[2] = s["total_reward"], s["length"], float(bool(s.get("evaluation")))
            for aid, pid in s["agent_policies"].items():
                if pid in self.pids:
                    i = self.pids.index(pid)
                    e[3 + 2 * i] += s["agent_rewards"].get(aid, 0.0)
                    e[4 + 2 * i] += 1
        return v

    def exchange(self, stop: bool) -> dict:
        """One collective; {"stop": bool, "more": episodes still to send somewhere}."""
        v = self._vector(stop).to(self.device)
        out = [torch.empty_like(v) for _ in range(self.info.world)]
        try:
            dist.all_gather(out, v)
        except RuntimeError as e:
            raise lost(e, self.info.rank) from None
        rows = [o.cpu() for o in out]
        env = sum(int(r[1]) for r in rows)
        self.env_steps += env
        for i, pid in enumerate(self.pids):
            self.has[pid] = [bool(r[5 + 3 * i] > 0) for r in rows]
            self.group_fed[pid] += sum(int(r[6 + 3 * i]) for r in rows)
            self.rows[pid] = [int(r[7 + 3 * i]) for r in rows]
        if self.info.writes:
            self._fold(rows[1:])
        return {"stop": any(r[0] > 0 for r in rows), "more": any(r[4] > 0 for r in rows)}

    def _fold(self, rows: List[torch.Tensor]) -> None:
        """Rank 0: the other ranks' counts and episodes into its runtime's metrics."""
        summaries = []
        for r, row in enumerate(rows, start=1):
            for j in range(int(row[3])):
                e = row[self.head + j * self.entry:self.head + (j + 1) * self.entry].tolist()
                agents, rewards = {}, {}
                for i, pid in enumerate(self.pids):
                    for k in range(int(e[4 + 2 * i])):   # each agent of the policy: their mean return
                        aid = f"{pid}/{k}"
                        agents[aid], rewards[aid] = pid, e[3 + 2 * i] / e[4 + 2 * i]
                summaries.append({"episode_id": f"rank{r}", "eps_id": 0, "session_id": f"rank{r}",
                                  "total_reward": e[0], "length": int(e[1]), "agent_rewards": rewards,
                                  "agent_policies": agents, "policy_rewards": {}, "custom_metrics": {},
                                  "training_enabled": True, "evaluation": bool(e[2]), "end_reason": f"rank {r}",
                                  "duration_s": 0.0})
        env = sum(int(row[1]) for row in rows)
        agent = sum(int(row[2]) for row in rows)
        m = self.runtime.metrics
        with self.runtime.ctx.lock:
            m.env_steps += env
            m.agent_steps += agent
            m.episodes += len(summaries)
            m.file_recent(summaries)
            self.remote["env"] += env
            self.remote["agent"] += agent
            self.remote["episodes"] += len(summaries)   # the checkpoint's recent returns read them there

    # ------------------------------------------------------------ weights

    def sync(self, pid: str) -> Learner:
        """The policy's spaces, networks, optimizers and update counts from the first rank that has
        it (rank 0 when it does) to every rank, once; the ranks without it build it first."""
        from simbridge.server.sessions import SpaceSpec
        from simbridge.trainer.run.checkpoint import space_bytes, space_from_bytes
        src = self.has[pid].index(True)
        learner, payload = self.runtime.policies.get(pid), None
        if self.info.rank == src:
            payload = state_bytes({"obs": space_bytes(learner.observation_space), "act": space_bytes(learner.action_space),
                              "nets": learner.nets_state(), "updates": learner.updates,
                              "forgiven": learner.updates_forgiven, "base": self.base.get(pid, 0)})
        try:
            state = state_from_bytes(self._broadcast_bytes(payload, src))
        except RuntimeError as e:
            raise lost(e, self.info.rank) from None
        if self.info.rank != src:
            spec = SpaceSpec(space_from_bytes(state["obs"]), space_from_bytes(state["act"]))
            self.runtime.policies.ensure(pid, spec, f"rank {src}'s {pid}")   # refuses other spaces
            learner = self.runtime.policies.get(pid)
            learner.load_nets_state(state["nets"])
            learner.updates, learner.updates_forgiven = state["updates"], state["forgiven"]
            learner.sync_acting()
        self.base[pid] = state["base"]
        average_gradients(learner, self.share)
        self.synced.add(pid)
        return learner

    def clock(self, pid: str) -> int:
        """The replay ratio's clock: rows per rank, the group's average (plus a resumed start)."""
        return self.base.get(pid, 0) + self.group_fed[pid] // self.info.world

    def train(self, pid: str, learner: Learner, max_updates: int) -> bool:
        """The updates due on the group's clock, at most max_updates, run on every rank (with the
        same count: the clock, update count and forgiven updates are the same everywhere). A rank
        with fewer rows than a batch runs them on filler rows with weight 0: it takes part in each
        all_reduce and its weights stay equal, without a sample of its own. True while more are owed."""
        if learner.ON_POLICY:
            return self.train_iteration(pid, learner, max_updates)
        cfg, rows = learner.config, self.rows[pid]
        ready = [r for r, n in enumerate(rows) if n >= cfg["batch_size"]]
        if not ready or learner.agent_steps < cfg["learning_starts"]:
            return False
        due = max(0, learner._update_target() - learner.updates - learner.updates_forgiven)
        if due == 0:
            return False
        if len(ready) < len(rows) and pid not in self.filler:
            src = max(range(len(rows)), key=lambda r: (rows[r], -r))   # the same choice on every rank
            row = {k: v[:1].cpu() for k, v in learner.replay.sample(1).items()} if src == self.info.rank else None
            self.filler[pid] = state_from_bytes(self._broadcast_bytes(state_bytes(row) if row is not None else None, src))
        mine = self.info.rank in ready
        self.share.weight, self.share.ready = (1.0 if mine else 0.0), len(ready)
        n, metrics = min(due, max_updates), {}
        for _ in range(n):
            if mine:
                batch = learner.replay.sample(cfg["batch_size"], learner.generator)
            else:
                batch = {k: v.to(learner.device).repeat(cfg["batch_size"], *[1] * (v.dim() - 1))
                         for k, v in self.filler[pid].items()}
            metrics = learner.update(batch)
            learner.updates += 1
        learner.sync_acting()
        if mine:
            learner.last_metrics = metrics
        return due > n

    def train_iteration(self, pid: str, learner: Learner, max_updates: int) -> bool:
        """PPO: an iteration starts on every rank at the same exchange, once the group's waiting rows
        reach world x train_batch_size, with the same number of minibatches per epoch everywhere
        (from the group's rows per rank), so every update has all its ranks. A rank with fewer rows
        than that number sits the iteration out: empty minibatches with weight 0, its rows left
        waiting for the next one. True while the iteration has updates left."""
        if learner.iteration is None:
            cfg, waiting, world = learner.config, self.rows[pid], self.info.world
            if sum(waiting) < world * cfg["train_batch_size"]:
                return False
            per_epoch = learner.minibatches(sum(waiting) // world)
            mine = waiting[self.info.rank] >= per_epoch
            learner.iteration = learner.start_iteration(per_epoch, take_rows=mine)
            self.iteration_share[pid] = (1.0 if mine else 0.0, sum(n >= per_epoch for n in waiting))
        it = learner.iteration
        self.share.weight, self.share.ready = self.iteration_share[pid]
        learner.run_updates(min(len(it["steps"]) - it["done"], max_updates), keep_metrics=self.share.weight > 0)
        return learner.iteration is not None

    def _broadcast_bytes(self, data: Optional[bytes], src: int) -> bytes:
        n = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=self.device)
        dist.broadcast(n, src)
        if data is not None:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buf = torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(buf, src)
        return buf.cpu().numpy().tobytes()


def _learns(p) -> bool:
    return isinstance(p, Learner) and trains(p)


