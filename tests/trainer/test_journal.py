"""The journal's records and segments (trainer/run/journal.py): what a kill leaves is read back
exactly, a torn or damaged record is dropped with the rest of its segment, nothing is ever
unpickled, and segments no resume needs are deleted."""
import json
import struct
import zlib

import numpy as np

from simbridge.trainer.run import journal as J
from simbridge.trainer.run import records as R
from simbridge.trainer.run.recovery import recover


class _Metrics:
    def __init__(self, env=0, agent=0, episodes=0):
        self.env_steps, self.agent_steps, self.episodes = env, agent, episodes


def _cols(n, eps=1, first_t=0):
    return {"obs": np.arange(n * 2, dtype=np.float32).reshape(n, 2),
            "nested": {"pos": np.ones((n, 3), np.float64), "flags": (np.zeros(n, np.int8),)},
            "rewards": np.full(n, 0.5, np.float32), "eps_id": np.full(n, eps, np.int64),
            "agent_index": np.zeros(n, np.int64), "t": np.arange(first_t, first_t + n),
            "infos": np.array([{"x": 1}] * n, dtype=object)}


def _row(cols, i):
    take = lambda v: {k: take(x) for k, x in v.items()} if isinstance(v, dict) else (
        tuple(take(x) for x in v) if isinstance(v, tuple) else v[i])
    return {k: take(v) for k, v in cols.items()}


def test_round_trip_across_a_checkpoint_and_a_torn_tail(tmp_path):
    j = J.Journal(tmp_path)
    a = _cols(3, eps=1)
    j.add_rows("p", a, 3)
    j.add_row("p", _row(_cols(2, eps=2), 0))
    j.add_row("p", _row(_cols(2, eps=2, first_t=1), 0))   # stacked with the previous row: one record
    j.add_rows("q", _cols(1, eps=3), 1)
    j.episode({"eps_id": 1, "total_reward": 1.5})
    j.commit(_Metrics(6, 6, 1))
    j.commit(_Metrics(6, 6, 1))                            # nothing changed: nothing written
    cut = j.rotate()
    assert cut == {"segment": 2, "rows": {"p": 5, "q": 1}}
    j.add_rows("p", _cols(2, eps=2, first_t=2), 2)
    j.commit(_Metrics(8, 8, 1))
    j.updates({"p": 7})
    j.close()
    seg2 = tmp_path / J.segment_name(2)
    whole = seg2.read_bytes()
    seg2.write_bytes(whole + R.encode({"k": "counters", "env": 99, "agent": 99, "episodes": 99})[:-3])  # torn

    rec = recover(tmp_path, since_segment=2, needed_from={})
    assert rec.torn == [f"{J.segment_name(2)}: {len(R.encode({'k': 'counters', 'env': 99, 'agent': 99, 'episodes': 99})) - 3} bytes"]
    assert rec.counters == {"env_steps": 8, "agent_steps": 8, "episodes": 1}   # not the torn 99s
    assert rec.summaries == [] and rec.updates == {"p": 7}   # the episode is before the checkpoint
    assert [(i, n, after) for i, _, n, after in rec.rows["p"]] == [(0, 3, False), (3, 2, False), (5, 2, True)]
    assert rec.rows_end() == {"p": 7, "q": 1}
    first = rec.rows["p"][0][1]
    np.testing.assert_array_equal(first["obs"], a["obs"])
    np.testing.assert_array_equal(first["nested"]["flags"][0], a["nested"]["flags"][0])
    assert "infos" not in first   # object columns are not journaled (no learner reads them)
    # Episodes 2 and 3 have transitions and no summary (1 has one, before the checkpoint): open
    # at the kill, ended from their transitions.
    lost, lost_q = rec.open_episodes()
    assert lost["eps_id"] == 2 and lost["end_reason"] == "trainer_lost" and lost["length"] == 4
    assert lost["total_reward"] == 4 * 0.5 and lost["agent_policies"] == {"agent0": "p"}
    assert lost_q["eps_id"] == 3 and lost_q["agent_policies"] == {"agent0": "q"} and lost_q["length"] == 1

    # Read from the start: the episode and the first counters are after "checkpoint" 1.
    rec1 = recover(tmp_path, since_segment=1, needed_from={})
    assert rec1.summaries == [{"eps_id": 1, "total_reward": 1.5}] and rec1.open_episodes()[0]["eps_id"] == 2


def test_damaged_records_are_dropped_and_nothing_is_unpickled(tmp_path):
    good = R.encode({"k": "counters", "env": 1, "agent": 1, "episodes": 0})
    # A record whose checksum is right but which asks for an object array: refused, not unpickled.
    h = json.dumps({"k": "rows", "p": "p", "i": 0, "n": 1, "cols": {"obs": 0}, "a": [["|O", [1]]]}).encode()
    payload = b"\x80\x04K\x01."   # a pickle of 1
    evil = struct.pack("<4sIII", R.MAGIC, len(h), len(payload), zlib.crc32(payload, zlib.crc32(h))) + h + payload
    recs, used = R.decode_all(good + evil + good)
    assert len(recs) == 1 and used == len(good)
    flipped = bytearray(good + good)
    flipped[len(good) + 20] ^= 0xFF   # a bit flipped in the second record: its CRC fails
    recs, used = R.decode_all(bytes(flipped))
    assert len(recs) == 1 and used == len(good)
    huge = struct.pack("<4sIII", R.MAGIC, 1 << 30, 0, 0)   # a damaged length: not read past the data
    assert R.decode_all(huge + good) == ([], 0)


def test_prune_deletes_only_segments_no_resume_needs(tmp_path):
    j = J.Journal(tmp_path)
    for seg in range(4):   # segments 1..4, 10 rows each: rows 0-9, 10-19, 20-29, 30-39
        j.add_rows("p", _cols(10), 10)
        j.commit(_Metrics(10 * (seg + 1), 10 * (seg + 1), 0))
        j.rotate()
    assert j.segment == 5
    # A resume replays rows from 15 on (ingested 35, a replay buffer of 20): segment 1 goes.
    assert j.prune({"p": 15}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [J.segment_name(n) for n in (2, 3, 4, 5)]
    assert j.prune({"p": 15}) == 0
    assert j.prune({"p": 40}) == 3   # everything ingested, nothing to refill: only the open segment stays
    assert [p.name for p in tmp_path.iterdir()] == [J.segment_name(5)]
    j.close()


def test_a_write_error_stops_journaling_without_failing_the_call(tmp_path, caplog):
    j = J.Journal(tmp_path)
    import os
    os.close(j._fd)
    j._fd = os.open(os.devnull, os.O_RDONLY)   # writes now fail (EBADF), as a full disk's would
    j.add_rows("p", _cols(2), 2)
    j.commit(_Metrics(2, 2, 0))   # no exception: the bridge keeps serving
    assert j.failed and "journaling stops" in caplog.text
    j.close()


def test_records_written_a_few_bytes_at_a_time_read_back_whole(tmp_path, monkeypatch):
    """The writer hands its records to writev without joining them: a write the kernel cuts
    short (a signal, a pipe-like file) goes on from where it stopped, in order."""
    real = J.os.writev
    monkeypatch.setattr(J.os, "writev", lambda fd, bufs: real(fd, [bytes(bufs[0])[:7]]))
    j = J.Journal(tmp_path)
    j.add_rows("p", _cols(3), 3)
    j.add_rows("p", _cols(2, first_t=3), 2)
    j.commit(_Metrics(5, 5, 0))
    j.close()
    data = (tmp_path / J.segment_name(1)).read_bytes()
    recs, used = R.decode_all(data)
    assert used == len(data) == j.bytes_written
    rows = [h for h, _ in recs if h["k"] == "rows"]
    assert sum(h["n"] for h in rows) == 5
