"""`simbridge-sim`: a reference simulator that runs a gymnasium env in its own loop.

The env runs here, in the simulator's process; actions come from a simbridge
server (`simbridge-server` or the trainer) and experience flows back to it:

    simbridge-server &                                   # random policy, port 50051
    simbridge-sim --env CartPole-v1 --episodes 100
    simbridge-sim --slots 8                              # 8 envs, one Step call per step for all
    simbridge-sim --slots 256 --vector                   # CartPole in numpy for all 256 slots at once
    simbridge-sim --off-policy-fraction 0.3              # some actions chosen here (log_action)
    simbridge-sim --inference local                      # act here with numpy, upload experience in chunks

With --slots 1 (the default) the loop is an ExternalEnv subclass, the way a
simulator would be written against RLlib's ExternalEnv. With --slots K > 1 the
K envs are a batched simulator on the Step call (SlotClient): one message each
way per step for all slots, and a slot whose episode ends starts its next one
in the same step (per-slot auto-reset, as envrax's BatchedEnv). With
--slot-protocol rows (needed for --off-policy-fraction and exact --episodes
budgets) the same K envs use get_actions / log_returns_batch / end_episodes.

Time-limit ends are reported as truncated=True, true terminal states as
truncated=False, as gymnasium's flags say. Stopping the simulator (SIGTERM,
Ctrl-C, --max-steps) ends its open episodes as truncated and says it stops
(end_episode's stopping=True): the trainer counts them apart (episodes_cut),
out of the returns, as the summary's cut_at_exit does here.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import sys
import uuid
from typing import List, Optional

import gymnasium as gym
import numpy as np

from simbridge.wire import tree
from simbridge.client.policy_client import PolicyClient
from simbridge.client.external_env import ExternalEnv
from simbridge.client.connection import SessionLost
from simbridge.sims.common import (Stats, StopFlag, add_common_args, cast_to_space, client_security, keep_client,
                                   run_cli)

PROG = "simbridge-sim"


def make_env(args) -> gym.Env:
    kwargs = {}
    if args.max_episode_steps:
        kwargs["max_episode_steps"] = args.max_episode_steps
    return gym.make(args.env, **kwargs)


class _Budget:
    """How many episodes may still start and whether the simulator must stop now."""

    def __init__(self, args, stats: Stats, stop: StopFlag):
        self.episodes = args.episodes
        self.max_steps = args.max_steps
        self.stats = stats
        self.stop = stop
        self.started = 0

    def must_stop(self) -> bool:
        return bool(self.stop) or bool(self.max_steps and self.stats.steps >= self.max_steps)

    def may_start(self, n: int) -> int:
        """How many of n new episodes may start now (and counts them as started)."""
        if self.must_stop():
            return 0
        if self.episodes:
            n = max(0, min(n, self.episodes - self.started))
        self.started += n
        return n


def _client_kwargs(args, slots: int) -> dict:
    return dict(transport=args.transport, connect_timeout_s=args.connect_timeout,
                client_name=f"{PROG}[{args.env}]x{slots}", security=client_security(args))


class GymExternalEnv(ExternalEnv):
    """One env, one episode at a time: the plain ExternalEnv loop."""

    def __init__(self, env: gym.Env, args, stats: Stats, stop: StopFlag):
        super().__init__(env.action_space, env.observation_space, args.address, **_client_kwargs(args, 1))
        self.env = env
        self.args = args
        self.stats = stats
        self.budget = _Budget(args, stats, stop)
        self.rng = np.random.default_rng(args.seed)
        if args.seed is not None:
            env.action_space.seed(args.seed)

    def _make_client(self):
        return keep_client(self.stats, super()._make_client)

    def run(self) -> None:
        env, args, stats = self.env, self.args, self.stats
        _ = self.client  # connect now, so an unreachable server fails before any work
        stats.connected = True
        seed = args.seed
        while self.budget.may_start(1):
            eid = self.start_episode(uuid.uuid4().hex, training_enabled=not args.no_training, evaluation=args.eval)
            obs, _ = env.reset(seed=seed)
            seed = None  # seed the first reset only; later ones continue its RNG
            obs = cast_to_space(self.observation_space, obs)
            ret = 0.0
            while True:
                if self.budget.must_stop():
                    self.end_episode(eid, obs, truncated=True, stopping=True)
                    stats.cut += 1
                    break
                if args.off_policy_fraction and self.rng.random() < args.off_policy_fraction:
                    action = env.action_space.sample()  # the simulator's own choice
                    self.log_action(eid, obs, action)
                    stats.off_policy_steps += 1
                else:
                    action = self.get_action(eid, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                obs = cast_to_space(self.observation_space, obs)
                ret += float(reward)
                stats.steps += 1
                self.log_returns(eid, float(reward))
                if terminated or truncated:
                    trunc = bool(truncated and not terminated)  # a terminal state is never a time limit
                    self.end_episode(eid, obs, truncated=trunc)
                    stats.episode(ret, trunc)
                    break
        self.close()


class LocalGymExternalEnv(GymExternalEnv):
    """The same loop with local inference: actions computed here (LocalPolicyClient, no torch)."""

    def _make_client(self):
        from simbridge.client.local_client import LocalPolicyClient
        a = self.args
        client = LocalPolicyClient(self.address, self.observation_space, self.action_space,
                                   update_interval_s=a.update_interval, chunk_steps=a.chunk_steps,
                                   max_buffered_steps=a.max_buffered_steps, connect_timeout_s=a.connect_timeout,
                                   client_name=f"{PROG}[{a.env}]local", seed=a.seed,
                                   security=client_security(a))
        self.stats.reports["local"] = client.stats   # in the summary also when a stop cuts the upload short
        return client


def run_batched(envs: List[gym.Env], args, stats: Stats, stop: StopFlag) -> None:
    """K envs stepped together; per-slot auto-reset."""
    k = len(envs)
    obs_space, act_space = envs[0].observation_space, envs[0].action_space
    client = keep_client(stats, lambda: PolicyClient(args.address, obs_space, act_space, **_client_kwargs(args, k)))
    stats.connected = True
    budget = _Budget(args, stats, stop)
    rng = np.random.default_rng(args.seed)
    seeds: List[Optional[int]] = [None if args.seed is None else args.seed + i for i in range(k)]
    for env, s in zip(envs, seeds):
        if s is not None:
            env.action_space.seed(s)
    eids: List[Optional[str]] = [None] * k
    obs: list = [None] * k
    rets = [0.0] * k
    training = not args.no_training

    def start(slots: List[int], started: Optional[List[str]] = None) -> None:
        """Reset `slots`' envs; their episodes are started here unless `started` already were."""
        if not slots:
            return
        ids = started or [uuid.uuid4().hex for _ in slots]
        if started is None:
            client.start_episodes(ids, training_enabled=training, evaluation=args.eval)  # ids chosen here: pipelined
        for s, eid in zip(slots, ids):
            o, _ = envs[s].reset(seed=seeds[s])
            seeds[s] = None
            eids[s], obs[s], rets[s] = eid, cast_to_space(obs_space, o), 0.0

    start(list(range(budget.may_start(k))))
    while True:
        live = [s for s in range(k) if eids[s] is not None]
        if not live:
            break
        if budget.must_stop():
            client.end_episodes([eids[s] for s in live], tree.stack([obs[s] for s in live]), [True] * len(live),
                                stopping=True)
            stats.cut += len(live)
            break
        off = [s for s in live if args.off_policy_fraction and rng.random() < args.off_policy_fraction]
        on = [s for s in live if s not in off]
        actions = {}
        if off:
            for s in off:
                actions[s] = envs[s].action_space.sample()
            client.log_actions([eids[s] for s in off], tree.stack([obs[s] for s in off]),
                               tree.stack([actions[s] for s in off]))
            stats.off_policy_steps += len(off)
        if on:
            acts = client.get_actions([eids[s] for s in on], tree.stack([obs[s] for s in on]))
            for i, s in enumerate(on):
                actions[s] = tree.take(acts, i)
        rewards, ended, ended_trunc = [], [], []
        for s in live:
            o, r, terminated, truncated, _ = envs[s].step(actions[s])
            obs[s] = cast_to_space(obs_space, o)
            rets[s] += float(r)
            rewards.append(float(r))
            if terminated or truncated:
                ended.append(s)
                ended_trunc.append(bool(truncated and not terminated))
        stats.steps += len(live)
        client.log_returns_batch([eids[s] for s in live], rewards)
        if ended:
            again = ended[:budget.may_start(len(ended))]
            new_ids = [uuid.uuid4().hex for _ in again]
            # Ends the finished slots' episodes and starts their next ones in one message.
            client.end_episodes([eids[s] for s in ended], tree.stack([obs[s] for s in ended]), ended_trunc,
                                start_episode_ids=new_ids, training_enabled=training, evaluation=args.eval)
            for s, tr in zip(ended, ended_trunc):
                stats.episode(rets[s], tr)
                eids[s] = None
            start(again, new_ids)
    client.close()


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many env steps in all (0: no bound)")
    p.add_argument("--max-episode-steps", type=int, default=None,
                   help="time limit per episode (default: the env's own)")
    p.add_argument("--slots", type=int, default=1,
                   help="env copies stepped together with batched calls (default: %(default)s)")
    p.add_argument("--slot-protocol", choices=["step", "rows"], default=None,
                   help="with --slots K > 1: 'step' (one Step message per step for all slots, "
                        "the default) or 'rows' (get_actions/log_returns_batch/end_episodes; "
                        "the default with --off-policy-fraction)")
    p.add_argument("--vector", action="store_true",
                   help="with --env CartPole-v1 and --slots K: step the K carts in numpy at once "
                        "(sims/vector_cartpole.py) instead of K gymnasium envs")
    p.add_argument("--off-policy-fraction", type=float, default=0.0, metavar="F",
                   help="with probability F per step, pick a random action here and report it with "
                        "log_action (default: %(default)s)")
    p.add_argument("--inference", choices=["remote", "local"], default="remote",
                   help="remote: the server computes actions (default); local: this process does, with "
                        "numpy, from the policy it downloads, and uploads its experience in chunks")
    p.add_argument("--update-interval", type=float, default=1.0, metavar="S",
                   help="local inference: seconds between checks for a newer policy (default: %(default)s)")
    p.add_argument("--chunk-steps", type=int, default=128, metavar="N",
                   help="local inference: transitions per upload (default: %(default)s)")
    p.add_argument("--max-buffered-steps", type=int, default=1024, metavar="N",
                   help="local inference: transitions kept while the server refuses more; then the "
                        "simulator waits (default: %(default)s)")
    return p


class GymSlots:
    """K gymnasium envs behind the batched-env interface of sims/vector_cartpole.py:
    step(actions) -> obs, rewards, terminated, truncated, final observations of the ended slots,
    each ended slot already reset (same-step auto-reset)."""

    def __init__(self, envs: List[gym.Env], seed: Optional[int]):
        self.envs = envs
        self.observation_space, self.action_space = envs[0].observation_space, envs[0].action_space
        self.seed = seed

    def reset(self):
        out = []
        for i, env in enumerate(self.envs):
            if self.seed is not None:
                env.action_space.seed(self.seed + i)
            o, _ = env.reset(seed=None if self.seed is None else self.seed + i)
            out.append(cast_to_space(self.observation_space, o))
        return tree.stack(out)

    def step(self, actions):
        obs, rewards, term, trunc, finals = [], [], [], [], []
        for i, env in enumerate(self.envs):
            o, r, te, tr, _ = env.step(tree.take(actions, i))
            o = cast_to_space(self.observation_space, o)
            if te or tr:
                finals.append(o)
                o, _ = env.reset()
                o = cast_to_space(self.observation_space, o)
            obs.append(o)
            rewards.append(r)
            term.append(bool(te))
            trunc.append(bool(tr and not te))
        final = tree.stack(finals) if finals else None
        return tree.stack(obs), np.asarray(rewards, np.float32), np.asarray(term), np.asarray(trunc), final


def run_step_slots(batched, args, stats: Stats, stop: StopFlag) -> None:
    """A batched simulator on Step: all slots in one message per step, auto-reset per slot."""
    from simbridge.client.slot_client import SlotClient

    k = len(batched.envs) if hasattr(batched, "envs") else batched.n
    client = keep_client(stats, lambda: SlotClient(
        args.address, batched.observation_space, batched.action_space, k, training_enabled=not args.no_training,
        evaluation=args.eval, **_client_kwargs(args, k)))
    stats.connected = True
    returns = np.zeros(k)
    obs = batched.reset()
    actions = client.step(obs)
    outcome = None
    try:
        # The last step (below) reports the outcome of the last actions: stop one step early.
        while not stop and not (args.max_steps and stats.steps + k >= args.max_steps) \
                and not (args.episodes and stats.episodes >= args.episodes):
            obs, rewards, term, trunc, finals = batched.step(actions)
            stats.steps += k
            returns += rewards
            outcome = (rewards, term, trunc, finals)
            for i in np.flatnonzero(term | trunc).tolist():
                stats.episode(float(returns[i]), bool(trunc[i]))
                returns[i] = 0.0
            actions = client.step(obs, rewards, term, trunc, finals)
            outcome = None
        # The last actions' outcome: step once more and report it with every slot's last
        # observation; the open episodes end truncated there.
        if outcome is None:
            obs2, rewards, term, trunc, finals = batched.step(actions)
            last = tree.map_structure(np.array, obs2)
            done = np.flatnonzero(term | trunc)
            returns += rewards
            for i in done.tolist():
                stats.episode(float(returns[i]), bool(trunc[i]))
            if len(done):
                def put(dst, src):
                    dst[done] = src
                tree.map_structure(put, last, finals)
            stats.steps += k
            stats.cut += int((~(term | trunc)).sum())
            client.close(rewards, term, trunc, last)
        else:
            client.close()
    except SessionLost:
        raise   # the client goes on with its new session: run_cli runs this again on it
    except BaseException:
        client.close()
        raise


def main(argv=None, prog: str = PROG) -> int:
    """prog: the name the messages and the summary's client name carry (simbridge-pixel-sim runs this)."""
    args = build_parser(prog).parse_args(argv)
    protocol = args.slot_protocol or ("rows" if args.off_policy_fraction else "step")
    refusals = [   # the options that cannot go together; the first that applies is said
        (args.slots < 1, "--slots must be >= 1"),
        (args.inference == "local" and args.slots != 1, "--inference local runs one env (--slots 1)"),
        (args.eval and args.inference == "local",
         "--eval needs --inference remote (greedy actions come from the trainer)"),
        (not 0.0 <= args.off_policy_fraction <= 1.0, "--off-policy-fraction must be in [0, 1]"),
        (protocol == "step" and args.off_policy_fraction,
         "--off-policy-fraction needs --slot-protocol rows (Step has no log_action)"),
        (args.vector and (args.env != "CartPole-v1" or args.slots < 2 or protocol != "step"),
         "--vector is for --env CartPole-v1 with --slots K > 1 on the step protocol")]
    for refused, why in refusals:
        if refused:
            print(f"{prog}: error: {why}", file=sys.stderr)
            return 2
    try:
        envs = [make_env(args) for _ in range(1 if args.vector else args.slots)]
    except gym.error.Error as e:
        print(f"{prog}: error: cannot make env {args.env!r}: {e}", file=sys.stderr)
        return 2
    stats = Stats(prog, args.print_every, args.quiet)

    def body(stop: StopFlag, stats: Stats) -> dict:
        if args.slots == 1 and args.inference == "local":
            LocalGymExternalEnv(envs[0], args, stats, stop).run()
            return {"env": args.env, "slots": 1, "inference": "local"}
        if args.slots == 1:
            GymExternalEnv(envs[0], args, stats, stop).run()  # run the loop on this thread
        elif protocol == "rows":
            run_batched(envs, args, stats, stop)
        elif args.vector:
            from simbridge.sims.vector_cartpole import VectorCartPole
            run_step_slots(VectorCartPole(args.slots, args.max_episode_steps or 500, seed=args.seed),
                           args, stats, stop)
        else:
            run_step_slots(GymSlots(envs, args.seed), args, stats, stop)
        return {"env": args.env, "slots": args.slots, "transport": args.transport,
                "slot_protocol": protocol if args.slots > 1 else None}

    try:
        return run_cli(prog, body, stats)
    finally:
        for env in envs:
            env.close()


if __name__ == "__main__":
    sys.exit(main())
