"""`simbridge-multiagent-sim`: reference multi-agent simulators (ExternalMultiAgentEnv).

Two games, both with their own loop in this process:

  * --game simultaneous, "multi-cartpole": --agents N CartPole-v1 instances are
    the agents "cart_0".."cart_{N-1}" of ONE episode. Every step all live agents
    send their observations in one get_action; rewards go per agent with
    log_returns; a cart that falls is marked done (multiagent_done_dict) and
    drops out while the others go on. The episode ends when all have fallen
    (terminated) or at the step limit (--max-episode-steps, truncated=True,
    with the final observations of the carts still up).
  * --game turn_based, Nim: a pile of 7-15 stones, "player_0" and "player_1"
    (random first mover) alternate taking 1-3 stones (Discrete(3): action a
    takes a+1, capped at the pile); whoever takes the last stone wins. Only the
    player to move is in the observation dict, observation
    [stones left / 15, player index]. At the end the winner gets +1 and the
    loser -1, logged once: the server holds the loser's -1 for its last
    action, which is still waiting for its outcome, so that action is the one
    credited (rewards add up per agent until its next action).

    simbridge-server --policy-map 'player_*=nim' &   # Nim's players to a policy of their own spaces
    simbridge-multiagent-sim --game simultaneous --agents 4 --episodes 50
    simbridge-multiagent-sim --game turn_based --episodes 200
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import sys
import uuid

import gymnasium as gym
import numpy as np

from simbridge.client.policy_client import MultiAgentPolicyClient
from simbridge.sims.common import (Stats, StopFlag, add_common_args, cast_to_space, client_security, keep_client,
                                   run_cli)

PROG = "simbridge-multiagent-sim"

NIM_MIN, NIM_MAX = 7, 15
NIM_PLAYERS = ("player_0", "player_1")
NIM_OBS_SPACE = gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
NIM_ACT_SPACE = gym.spaces.Discrete(3)


def _client(args, stats: Stats, obs_space, act_space, name: str) -> MultiAgentPolicyClient:
    return keep_client(stats, lambda: MultiAgentPolicyClient(
        args.address, obs_space, act_space, transport=args.transport, connect_timeout_s=args.connect_timeout,
        client_name=f"{PROG}[{name}]", security=client_security(args)))


def _may_start(args, stop: StopFlag, started: int) -> bool:
    return not stop and (not args.episodes or started < args.episodes)


def run_simultaneous(args, stats: Stats, stop: StopFlag) -> dict:
    aids = [f"cart_{i}" for i in range(args.agents)]
    limit = args.max_episode_steps
    envs = {a: gym.make("CartPole-v1", max_episode_steps=limit) for a in aids}
    obs_space, act_space = envs[aids[0]].observation_space, envs[aids[0]].action_space
    for i, a in enumerate(aids):
        if args.seed is not None:
            envs[a].action_space.seed(args.seed + i)
    client = _client(args, stats, obs_space, act_space, f"multi-cartpole x{len(aids)}")
    stats.connected = True
    seed = args.seed
    started = 0
    agent_steps = 0
    try:
        while _may_start(args, stop, started):
            started += 1
            eid = client.start_episode(uuid.uuid4().hex, training_enabled=not args.no_training, evaluation=args.eval)
            obs = {}
            for i, a in enumerate(aids):
                o, _ = envs[a].reset(seed=None if seed is None else seed + i)
                obs[a] = cast_to_space(obs_space, o)
            seed = None if seed is None else seed + len(aids)
            live = list(aids)
            rets = {a: 0.0 for a in aids}
            t = 0
            while True:
                if stop:
                    client.end_episode(eid, {a: obs[a] for a in live}, truncated=True, stopping=True)
                    stats.cut += 1
                    break
                actions = client.get_action(eid, {a: obs[a] for a in live})
                rewards, fallen = {}, {}
                for a in live:
                    # The cart's own time limit equals ours; the episode's counter decides.
                    o, r, terminated, _, _ = envs[a].step(actions[a])
                    obs[a] = cast_to_space(obs_space, o)
                    rewards[a] = float(r)
                    rets[a] += float(r)
                    if terminated:
                        fallen[a] = True
                t += 1
                stats.steps += 1
                agent_steps += len(live)
                # A fallen cart is done; the others go on. (log_returns cannot carry its final
                # observation yet, so the server reuses its last one as new_obs: harmless for a
                # terminated transition, which is not bootstrapped.)
                client.log_returns(eid, rewards, multiagent_done_dict=fallen or None)
                live = [a for a in live if a not in fallen]
                if not live:
                    client.end_episode(eid, truncated=False)
                    stats.episode(sum(rets.values()), False, rets)
                    break
                if t >= limit:
                    client.end_episode(eid, {a: obs[a] for a in live}, truncated=True)
                    stats.episode(sum(rets.values()), True, rets)
                    break
    finally:
        for env in envs.values():
            env.close()
    client.close()
    return {"game": "simultaneous", "agents": len(aids), "agent_steps": agent_steps}


def nim_obs(stones: int, player: int) -> np.ndarray:
    return np.array([stones / NIM_MAX, float(player)], dtype=np.float32)


def run_turn_based(args, stats: Stats, stop: StopFlag) -> dict:
    rng = np.random.default_rng(args.seed)
    client = _client(args, stats, NIM_OBS_SPACE, NIM_ACT_SPACE, "nim")
    stats.connected = True
    started = 0
    first_mover_wins = 0
    while _may_start(args, stop, started):
        started += 1
        eid = client.start_episode(uuid.uuid4().hex, training_enabled=not args.no_training, evaluation=args.eval)
        stones = int(rng.integers(NIM_MIN, NIM_MAX + 1))
        first = turn = int(rng.integers(2))
        acted = set()   # players whose last move waits for its outcome
        while True:
            if stop:
                # Cut short: each player that moved gets the position it would now see, so the
                # learners bootstrap from the real state (a truncated end needs it).
                client.end_episode(eid, {NIM_PLAYERS[p]: nim_obs(stones, p) for p in acted}, truncated=True,
                                   stopping=True)
                stats.cut += 1
                break
            me = NIM_PLAYERS[turn]
            action = client.get_action(eid, {me: nim_obs(stones, turn)})[me]
            acted.add(turn)
            stones -= min(int(action) + 1, stones)
            stats.steps += 1
            if stones == 0:  # `me` took the last stone
                other = NIM_PLAYERS[1 - turn]
                # One log_returns at the end: +1 completes the winner's last
                # transition, -1 lands on the loser's last (still pending) one.
                client.log_returns(eid, {me: 1.0, other: -1.0})
                client.end_episode(eid, {me: nim_obs(0, turn), other: nim_obs(0, 1 - turn)}, truncated=False)
                first_mover_wins += turn == first
                stats.episode(0.0, False, {me: 1.0, other: -1.0})
                break
            turn = 1 - turn
    client.close()
    rate = round(first_mover_wins / stats.episodes, 4) if stats.episodes else None
    return {"game": "turn_based", "first_mover_win_rate": rate}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--game", choices=["simultaneous", "turn_based"], default="simultaneous",
                   help="which game (default: %(default)s)")
    p.add_argument("--agents", type=int, default=4,
                   help="carts in the simultaneous game (default: %(default)s)")
    p.add_argument("--max-episode-steps", type=int, default=500,
                   help="step limit of a simultaneous episode, ends it truncated (default: %(default)s)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.agents < 1 or args.max_episode_steps < 1:
        print(f"{PROG}: error: --agents and --max-episode-steps must be >= 1", file=sys.stderr)
        return 2
    stats = Stats(PROG, args.print_every, args.quiet)
    run = run_simultaneous if args.game == "simultaneous" else run_turn_based
    return run_cli(PROG, lambda stop, st: dict(run(args, st, stop), transport=args.transport), stats)


if __name__ == "__main__":
    sys.exit(main())
