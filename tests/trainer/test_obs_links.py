"""A camera's obs journaled once per transition (trainer/run/obs_links.py): every row reads back
bit for bit, whatever the agents, chunks, ends, resets and segments; the bytes on disk halve."""
import numpy as np
import pytest

from simbridge.trainer.run import journal as J
from simbridge.trainer.run import records as R
from simbridge.trainer.run import obs_links
from simbridge.trainer.run.recovery import recover


class _Metrics:
    env_steps = agent_steps = episodes = 0


def _stream(seed: int, steps: int = 120, agents: int = 5, dict_obs: bool = True):
    """Transitions of `agents` agents of one policy as the bridge makes them: each obs is its
    agent's last new_obs, except where an episode starts again (a done, or a reset the bridge
    saw as a new episode) or an agent's obs was changed (a row the journal must keep)."""
    rng = np.random.default_rng(seed)

    def frame():
        cam = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)   # 2,304 B: under MIN_ROW_BYTES alone
        cam2 = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        joints = rng.standard_normal(7).astype(np.float32)
        joints[0] = np.nan if rng.random() < 0.1 else joints[0]   # NaNs compare by their bytes
        return {"camera": np.stack([cam, cam2]), "joints": joints} if dict_obs else np.stack([cam, cam2])

    last, eps, t = {}, {}, {}
    next_eps = [100]
    rows = []
    for _ in range(steps):
        a = int(rng.integers(agents))
        if a not in eps:
            eps[a], t[a] = next_eps[0], 0
            next_eps[0] += 1
            last[a] = frame()
        obs = last[a] if rng.random() > 0.1 else frame()   # 10%: not the last new_obs
        new = frame()
        term = bool(rng.random() < 0.05)
        trunc = bool(not term and rng.random() < 0.03)
        rows.append({"obs": obs, "new_obs": new, "actions": np.int64(rng.integers(3)),
                     "rewards": np.float32(rng.random()), "terminateds": term, "truncateds": trunc,
                     "eps_id": eps[a], "agent_index": a, "t": t[a]})
        t[a] += 1
        last[a] = new
        if term or trunc:
            del eps[a]
    return rows


def _chunk(rows):
    out = {}
    for k in rows[0]:
        vals = [r[k] for r in rows]
        if isinstance(vals[0], dict):
            out[k] = {s: np.stack([v[s] for v in vals]) for s in vals[0]}
        else:
            out[k] = np.asarray(vals)
    return out


def _write(tmp_path, rows, seed, rotate_at=()):
    """Rows into a journal as the bridge gives them: chunks of 1-9 rows, single rows, commits,
    rotations; returns the chunks in row order."""
    rng = np.random.default_rng(seed + 1)
    j = J.Journal(tmp_path)
    fed, i = [], 0
    while i < len(rows):
        n = int(rng.integers(1, 10))
        part = rows[i:i + n]
        if len(part) == 1 and rng.random() < 0.5:
            j.add_row("p", part[0])
        else:
            j.add_rows("p", _chunk(part), len(part))
        fed.extend(part)
        i += len(part)
        if rng.random() < 0.6:
            j.commit(_Metrics())
        if any(i - len(part) < r <= i for r in rotate_at):
            j.rotate()
    j.close()
    return fed


def _same_rows(rec_rows, fed):
    cols = [c for _, c, _, _ in rec_rows]
    got = {k: (np.concatenate([c[k] for c in cols]) if not isinstance(cols[0][k], dict) else
               {s: np.concatenate([c[k][s] for c in cols]) for s in cols[0][k]}) for k in cols[0]}
    want = _chunk(fed)
    assert set(got) == set(want)
    for k in want:
        if isinstance(want[k], dict):
            for s in want[k]:
                assert got[k][s].tobytes() == want[k][s].tobytes(), (k, s)
        else:
            assert got[k].tobytes() == want[k].astype(got[k].dtype).tobytes(), k


@pytest.mark.parametrize("seed", range(6))
def test_every_row_reads_back_bit_for_bit_across_chunks_ends_and_segments(tmp_path, seed):
    rows = _stream(seed, dict_obs=seed % 2 == 0)
    fed = _write(tmp_path, rows, seed, rotate_at=(40, 41, 90))
    rec = recover(tmp_path, since_segment=1, needed_from={})
    assert not rec.torn
    _same_rows(rec.rows["p"], fed)
    linked = kept = 0
    for seg in sorted(tmp_path.glob("seg-*.sbj")):
        for h, arrays in R.decode_all(seg.read_bytes())[0]:
            if h["k"] == "rows":
                mask = arrays[h["cols"][obs_links.LINKED]]
                linked, kept = linked + int(mask.sum()), kept + int((~mask).sum())
    assert linked > 2 * kept > 0   # most rows linked; the changed obs, first rows and resets kept


def test_a_resume_reading_from_a_later_row_still_resolves_the_links_before_it(tmp_path):
    """Rows a resume does not need are skipped, yet their links are followed: a later row's obs
    can be an earlier skipped row's new_obs."""
    rows = _stream(7, steps=80, agents=2)
    fed = _write(tmp_path, rows, 7)
    rec = recover(tmp_path, since_segment=2, needed_from={"p": 60})
    got = rec.rows["p"]
    assert got[0][0] <= 60 < got[0][0] + got[0][2] or got[0][0] >= 60
    _same_rows(got, fed[got[0][0]:])


def test_a_camera_is_written_once_per_transition_and_vectors_are_not_linked(tmp_path):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (201, 84, 84, 3), dtype=np.uint8)
    rows = [{"obs": frames[t], "new_obs": frames[t + 1], "rewards": np.float32(1), "terminateds": False,
             "truncateds": False, "eps_id": 1, "agent_index": 0, "t": t} for t in range(200)]
    j = J.Journal(tmp_path / "cam")
    for r in rows:
        j.add_rows("p", _chunk([r]), 1)
        j.commit(_Metrics())
    j.close()
    size = (tmp_path / "cam" / J.segment_name(1)).stat().st_size
    assert size < 201 * frames[0].nbytes * 1.02   # each frame once (the first obs too), not twice
    _same_rows(recover(tmp_path / "cam", 1, {}).rows["p"], rows)

    vec = [dict(r, obs=np.float32([t, 1]), new_obs=np.float32([t + 1, 1])) for t, r in enumerate(rows)]
    j = J.Journal(tmp_path / "vec")
    for r in vec:
        j.add_rows("p", _chunk([r]), 1)
        j.commit(_Metrics())
    j.close()
    data = (tmp_path / "vec" / J.segment_name(1)).read_bytes()
    assert obs_links.LINKED.encode() not in data
    _same_rows(recover(tmp_path / "vec", 1, {}).rows["p"], vec)


@pytest.mark.parametrize("bound", [("LIMIT", 3), ("BUDGET", 70 * 4636)])   # 64 agents at least
def test_agents_never_finished_are_forgotten_at_the_limit_on_both_sides(tmp_path, monkeypatch, bound):
    monkeypatch.setattr(obs_links, *bound)
    rows = _stream(11, steps=400, agents=90)
    fed = _write(tmp_path, rows, 11)
    _same_rows(recover(tmp_path, 1, {}).rows["p"], fed)


def test_a_linked_record_whose_agent_is_unknown_is_read_as_torn(tmp_path):
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    row = {"obs": frame, "new_obs": frame, "rewards": np.float32(1), "terminateds": False,
           "truncateds": False, "eps_id": 1, "agent_index": 0, "t": 0}
    j = J.Journal(tmp_path)
    j.add_rows("p", _chunk([row]), 1)
    j.commit(_Metrics())
    j.add_rows("p", _chunk([dict(row, t=1)]), 1)   # linked to the first
    j.commit(_Metrics())
    j.close()
    seg = tmp_path / J.segment_name(1)
    data = seg.read_bytes()
    recs, _ = R.decode_all(data)
    assert [h["k"] for h, _ in recs] == ["rows", "counters", "rows"]
    assert recs[2][1][recs[2][0]["cols"][obs_links.LINKED]].tolist() == [True]
    seg.write_bytes(data[_record_end(data):])   # the first record gone: the link has nothing to follow
    rec = recover(tmp_path, 1, {})
    assert rec.torn and "p" not in rec.rows


def _record_end(data: bytes) -> int:
    """The end of the first record (its head says its lengths)."""
    _, hlen, plen, _ = R.HEAD.unpack_from(data, 0)
    return R.HEAD.size + hlen + plen


def test_the_bridges_camera_rows_read_back_from_the_journal_as_the_learner_got_them(tmp_path):
    """A real server with the trainer's journal attached: a lockstep simulator (PolicyClient,
    episodes ended and cut) and a batched one (SlotClient, slots done at random) send a camera
    beside joints; every row the collector handed on reads back from the journal bit for bit,
    most obs linked."""
    import threading

    import gymnasium as gym

    from simbridge.client.policy_client import PolicyClient
    from simbridge.client.slot_client import SlotClient
    from simbridge.server.runtime import BridgeConfig, BridgeRuntime
    from simbridge.server.service import BridgeServer

    space = gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (48, 64, 3), np.uint8),
                             "joints": gym.spaces.Box(-1, 1, (7,), np.float32)})
    rng = np.random.default_rng(5)

    def obs(n=None):
        shape = () if n is None else (n,)
        return {"camera": rng.integers(0, 256, (*shape, 48, 64, 3), dtype=np.uint8),
                "joints": rng.uniform(-1, 1, (*shape, 7)).astype(np.float32)}

    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=16))
    j = J.Journal(tmp_path)
    rt.ctx.set_journal(j)
    got, stop = [], threading.Event()

    def learner():
        while not stop.is_set() or rt.experience.qsize():
            b = rt.experience.get(timeout=0.1)
            if b is not None:
                got.append(b)
    drain = threading.Thread(target=learner, daemon=True)
    drain.start()
    server = BridgeServer(rt, "127.0.0.1:0").start()
    try:
        pc = PolicyClient(server.address, space, gym.spaces.Discrete(3), pipeline=False)
        for e in range(6):
            eid = pc.start_episode()
            for _ in range(int(rng.integers(2, 9))):
                pc.get_action(eid, obs())
                pc.log_returns(eid, 1.0)
            pc.end_episode(eid, obs(), truncated=bool(e % 2))
        sc = SlotClient(server.address, space, gym.spaces.Discrete(3), num_slots=4)
        sc.step(obs(4))
        for _ in range(30):
            done = rng.random(4) < 0.15
            sc.step(obs(4), rewards=np.ones(4, np.float32), terminated=done, truncated=np.zeros(4, bool),
                    final_observations=obs(int(done.sum())) if done.any() else None)
        pc.close()
        sc.close()
        rt.flush()
    finally:
        server.stop(0)
        stop.set()
        drain.join(10)
    j.close()

    rows = [b.policy_batches["default_policy"] for b in got if "default_policy" in b.policy_batches]
    want = {k: (np.concatenate([r[k] for r in rows]) if not isinstance(rows[0][k], dict) else
                {s: np.concatenate([r[k][s] for r in rows]) for s in rows[0][k]}) for k in ("obs", "new_obs", "eps_id")}
    rec = recover(tmp_path, 1, {})
    chunks = [c for _, c, _, _ in rec.rows["default_policy"]]
    assert sum(len(c["eps_id"]) for c in chunks) == len(want["eps_id"]) > 100
    for k in ("obs", "new_obs"):
        for s in ("camera", "joints"):
            assert np.concatenate([c[k][s] for c in chunks]).tobytes() == want[k][s].tobytes(), (k, s)
    linked = sum(int(a[h["cols"][obs_links.LINKED]].sum()) for h, a in R.decode_all(
        (tmp_path / J.segment_name(1)).read_bytes())[0] if h["k"] == "rows")
    assert linked > len(want["eps_id"]) // 2


def _one(eps, obs, new, t=0):
    return {"obs": obs[None], "new_obs": new[None], "rewards": np.ones(1, np.float32),
            "terminateds": np.zeros(1, bool), "truncateds": np.zeros(1, bool),
            "eps_id": np.array([eps]), "agent_index": np.zeros(1, np.int64), "t": np.array([t])}


def test_records_built_and_never_written_end_the_segments_links(tmp_path):
    """An error while a call's records are made loses them (as before), and no later row of the
    segment may link to the bytes they held: the reader would put back another frame."""
    z, a, b = (np.full((64, 64), v, np.uint8) for v in (0, 1, 2))
    j = J.Journal(tmp_path)
    j.add_rows("p", _one(1, z, a), 1)
    j.commit(_Metrics())
    j.add_rows("p", _one(1, a, b, 1), 1)              # built, linked to a ...
    j.add_row("q", {"obs": np.zeros(2)})
    j.add_row("q", {"x": np.zeros(2)})                # ... and lost: another column set raises
    with pytest.raises(KeyError):
        j.commit(_Metrics())
    j.add_rows("p", _one(1, b, a, 2), 1)              # its obs is b, which is not on disk
    j.commit(_Metrics())
    j.rotate()                                        # a new segment links again
    j.add_rows("p", _one(1, a, b, 3), 1)
    j.add_rows("p", _one(1, b, a, 4), 1)
    j.close()
    rec = recover(tmp_path, 1, {})
    assert not rec.torn
    assert [int(o[0, 0]) for _, c, _, _ in rec.rows["p"] for o in c["obs"]] == [0, 2, 1, 2]
    data = (tmp_path / J.segment_name(2)).read_bytes()
    last = [(h, arr) for h, arr in R.decode_all(data)[0] if h["k"] == "rows"][-1]
    assert last[1][last[0]["cols"][obs_links.LINKED]].tolist() == [False, True]   # a new segment links again


def test_odd_rows_and_names_read_back(tmp_path):
    """Big rows strided in memory, a zero-row first chunk, a policy named like a number, an obs
    whose bytes equal the last new_obs in another dtype (not linked), an upload's long chunk."""
    rng = np.random.default_rng(9)
    pid = "pol8765432101234"
    wide = rng.standard_normal((3, 40000)).astype(np.float32)
    frames = rng.integers(0, 256, (3, 64, 64), dtype=np.uint8)
    j = J.Journal(tmp_path)
    empty = _one(1, frames[0], frames[1])
    j.add_rows(pid, {k: v[:0] for k, v in empty.items()}, 0)
    j.add_rows(pid, _one(1, frames[0], frames[1]), 1)
    j.add_rows(pid, _one(1, frames[1], frames[2], 1), 1)   # linked
    j.add_rows("s", {"obs": wide[:, ::2][:2], "new_obs": wide[:, ::2][1:], "eps_id": np.array([5, 5]),
                     "agent_index": np.zeros(2, np.int64), "rewards": np.ones(2, np.float32)}, 2)
    j.add_rows("d", _one(7, frames[0].view(np.int8), frames[1].view(np.int8)), 1)
    j.add_rows("d", _one(7, frames[1], frames[2], 1), 1)   # the same bytes as uint8: kept
    up = {"obs": np.repeat(frames[:1], 200, 0), "new_obs": np.repeat(frames[1:2], 200, 0),
          "eps_id": np.full(200, 3), "agent_index": np.zeros(200, np.int64), "rewards": np.ones(200, np.float32)}
    j.add_rows("u", up, 200)
    j.commit(_Metrics())
    held = j._links.last["u"][(3, 0)][0]
    assert held.base is None or held.base.size < up["new_obs"].size   # not the upload's 200 rows
    j.close()
    rec = recover(tmp_path, 1, {})
    got = {p: np.concatenate([c["obs"] for _, c, _, _ in rows]) for p, rows in rec.rows.items()}
    assert got[pid].tobytes() == frames[:2].tobytes()
    assert got["s"].tobytes() == np.ascontiguousarray(wide[:, ::2][:2]).tobytes()
    d = [c["obs"] for _, c, _, _ in rec.rows["d"]]
    assert [x.dtype for x in d] == [np.int8, np.uint8] and b"".join(x.tobytes() for x in d) == frames[:2].tobytes()
    assert got["u"].tobytes() == up["obs"].tobytes()
