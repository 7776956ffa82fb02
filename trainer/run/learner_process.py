"""Learners in a process of their own, beside the bridge: acting and learning overlap.

`[run] learner_process = true`. Why a process and not a thread: the daemon's gRPC threads and
a learner thread share one GIL. torch releases it around every op and must take it back from
the request threads each time, so a learner thread beside a busy bridge spends much of its
time waiting for the GIL and the bridge waits for the learner's Python. A child process has
its own interpreter: the bridge serves while the learner updates, on another core.

The parent (the daemon's loop) keeps the runtime's Learner, built acting_only (no optimizer:
optim.HeldOptimizer keeps a resumed checkpoint's optimizer state for the child): it acts and
exports from its acting copy, which takes the child's weights after every chunk of updates (its
version is the child's update count), and it counts the rows it sends (agent_steps: the replay
ratio's clock and the exploration schedule). The child builds the same Learner class from the
same spaces and config, loads the parent's whole state (networks, optimizer state, counters,
replay buffer), adds the rows, runs the updates due in chunks and sends the acting weights back.

Rate limiter, as DeepMind Reverb's SampleToInsertRatio: the ratio is the learner's own
(`updates_per_step`, gradient updates per agent step; none before learning_starts). The child
never runs ahead of it (an update that is not due waits for rows), and while a child is more than `[run]
max_updates_behind` updates behind, the bridge holds the puts of finished fragments
(ExperienceQueue.hold_while): the simulators that finished one wait; nothing is dropped. The
parent hands whatever is queued to the child at once, so the acting weights trail the
simulators by the tolerance and a fragment or so, not by the queue's fragments as well.

Between the two: a pipe carrying bytes only. Rows go in the journal's record format (JSON
and raw arrays, trainer/run/records.py); states and weights as torch.save bytes, read back with
torch's safe loader (weights_only=True). Experience is never pickled.
"""
import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
import sys
import time
import traceback
from typing import List, Optional, Tuple

import torch

from simbridge.server.heap import keep_freed_memory
from simbridge.trainer.run import gcquiet, mailbox, records
from simbridge.trainer.run.checkpoint import state_bytes, state_from_bytes

log = logging.getLogger("simbridge.trainer")
STATE_WAIT_SAID_S = 2.0   # a wait for a child's state this long is said (a checkpoint, the stop)

CHUNK = 64          # updates between two weight hand-overs
_INIT, _ROWS, _STATE_Q, _STOP = b"I", b"R", b"Q", b"X"      # parent -> child
_WEIGHTS, _STATE, _ERROR = b"W", b"S", b"E"                # child -> parent


class LearnerProcessDied(RuntimeError):
    """The child training a policy is gone; the message says what to do."""




def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(path: str) -> type:
    import importlib
    mod, _, name = path.partition(":")
    obj = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class LearnerProcess:
    """The parent's handle on one policy's training child. All calls from one thread (the loop)."""

    def __init__(self, policy_id: str, learner, torch_threads: int = 1, child: Optional["Child"] = None):
        """child: one started beforehand (spawn_child), whose imports are done by now."""
        from simbridge.trainer.run.checkpoint import space_bytes
        self.policy_id = policy_id
        self.learner = learner
        self._sent = learner.agent_steps   # rows in the child's count (its state's, then sent)
        # The child's last report: (updates due, rows it had then). One tuple, assigned at once:
        # the limiter reads it from RPC threads.
        self._report = (0, self._sent)
        self._dead: Optional[str] = None
        needs_main = type(learner).__module__ == "__main__"
        if child is not None and needs_main:   # a spare started without the caller's script: no use here
            child[1].close()
            child = None
        self.proc, self.conn = child or spawn_child(with_main=needs_main)
        init = {"cls": _class_path(type(learner)), "obs": space_bytes(learner.observation_space),
                "act": space_bytes(learner.action_space), "config": dict(learner.config),
                "device": str(learner.trains_on), "torch_threads": int(torch_threads),
                "acting_device": "cpu" if learner.acting_device.type == "cpu" else "learner",
                "log_level": log.getEffectiveLevel(),
                "state": learner.state_dict(include_replay=True)}
        self._send(_INIT + state_bytes(init))
        # The child holds the buffer now; the parent's copy only wasted memory.
        learner.replay = learner.new_replay()
        learner.trained_by = self

    # ---------------------------------------------------------------- parent side

    def add(self, batch) -> None:
        """Rows for the child; counted here at once (the ratio's clock, exploration schedules).
        Never raises: a dead child is reported by poll() and state()."""
        if batch.count == 0:
            return
        self.learner.agent_steps += batch.count
        self.learner.count_rows(batch)
        self._sent += batch.count
        if self._dead is None:
            try:
                self._send(records.encode_rows({k: batch[k] for k in batch}, batch.count, prefix=_ROWS, checked=False))
            except LearnerProcessDied:
                pass   # poll() and state() report it; the rows are in the journal

    def behind(self, queued_rows: int = 0) -> float:
        """Updates the child owes: its last report plus what the rows sent since, and
        `queued_rows` more (let into the bridge's queue, not yet sent), will make due."""
        due, rows = self._report   # before _sent: a report newer than the _sent read would undercount
        return due + self.learner.updates_made_due(rows, self._sent + queued_rows)

    def poll(self, timeout: float = 0.0) -> bool:
        """Applies what the child has sent; True when weights came."""
        got = False
        while self._alive_conn().poll(timeout):
            timeout = 0.0
            got |= self._handle(self._recv()) == _WEIGHTS
        return got

    def state(self, include_replay: bool) -> dict:
        """The child's whole state, after every row sent so far (the pipe keeps order)."""
        self._send(_STATE_Q + (b"1" if include_replay else b"0"))
        asked = time.monotonic()
        said = False
        while time.monotonic() < asked + 600:
            msg = self._recv(timeout=1.0)
            if msg is not None and self._handle(msg) == _STATE:
                return self._state
            if not said and time.monotonic() > asked + STATE_WAIT_SAID_S:
                said = True
                log.warning("policy %r: waiting for its learner process's state, which it sends after the "
                            "updates in hand (up to %d)%s", self.policy_id, CHUNK, self._compiling())
        raise self._died("did not send its state within 600 s")

    def _compiling(self) -> str:
        if self.learner.update_path == "compile" and self.learner.updates == 0:
            return ": torch.compile is still building the first (seconds to minutes)"
        return ""

    def close(self, timeout: float = 10.0) -> None:
        if self.proc.is_alive() and self._dead is None:
            try:
                self.conn.send_bytes(_STOP)
            except OSError:
                pass
        # The child sends what it has queued before it exits (weights after the final state: SAC's
        # are 4x the pipe's 64 KiB): read and drop it. Unread, the child's send waited on a full
        # pipe until the timeout killed it, and a stopped trainer took 12-15 s to exit.
        deadline = time.monotonic() + timeout
        while self.proc.is_alive() and (left := deadline - time.monotonic()) > 0:
            if self.conn in mp.connection.wait([self.conn, self.proc.sentinel], left):
                try:
                    self.conn.recv_bytes()
                except (EOFError, OSError):   # the child closed its end: it is exiting
                    self.proc.join(max(0.0, deadline - time.monotonic()))
                    break
        self.kill()
        self.conn.close()

    def kill(self) -> None:
        """At once, without its state (the trainer's second Ctrl-C)."""
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)

    # ---------------------------------------------------------------- internals

    def _handle(self, msg: bytes) -> bytes:
        tag, body = msg[:1], msg[1:]
        if tag == _WEIGHTS:
            w = state_from_bytes(body)
            p = self.learner
            with p._act_lock:
                p.acting.load_state_dict(w["acting"])
                p.version = w["updates"]
            p.updates, p.updates_forgiven = w["updates"], w["forgiven"]
            p.last_metrics = w["metrics"]
            self._report = (w["due"], w["rows"])
        elif tag == _STATE:
            self._state = state_from_bytes(body)
        elif tag == _ERROR:
            trace = body.decode(errors="replace")
            log.debug("learner process of policy %r:\n%s", self.policy_id, trace)
            last = [line for line in trace.splitlines() if line.strip()][-1:] or ["?"]
            raise self._died(f"failed ({last[0].strip()[:300]}; --log-level DEBUG shows where)")
        return tag

    def _send(self, data: bytes) -> None:
        try:
            self._alive_conn().send_bytes(data)
        except OSError:
            raise self._died("closed its pipe") from None

    def _recv(self, timeout: Optional[float] = None) -> Optional[bytes]:
        conn = self._alive_conn()
        if timeout is not None and not conn.poll(timeout):
            if not self.proc.is_alive():
                raise self._died("exited")
            return None
        try:
            return conn.recv_bytes()
        except (EOFError, OSError):
            raise self._died("exited") from None

    def _alive_conn(self):
        if self._dead is not None:
            raise LearnerProcessDied(self._dead)
        return self.conn

    def _died(self, what: str) -> LearnerProcessDied:
        self.proc.join(1.0)
        code = self.proc.exitcode
        self._dead = (f"the learner process of policy {self.policy_id!r} {what} (exit code {code}): the trainer "
                      f"stops; `simbridge-trainer run --resume` continues from the last checkpoint and journal")
        return LearnerProcessDied(self._dead)


Child = Tuple[mp.process.BaseProcess, mp.connection.Connection]


def spawn_child(with_main: bool = False) -> Child:
    """A learner process, started: it imports torch and waits for its learner. Spawned ahead of
    need, its seconds of imports do not hold up the loop when a policy's first rows come.
    with_main: the learner's class is defined in the caller's script, which the child must then
    run again (as multiprocessing's spawn always does; the script needs its __main__ guard)."""
    ctx = mp.get_context("spawn")   # never fork: the parent runs gRPC threads
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=gcquiet.run_imported, args=(__name__, _child_main.__name__, child_conn),
                       name="simbridge-learner", daemon=True)
    with contextlib.nullcontext() if with_main else _callers_script_hidden():
        proc.start()
    child_conn.close()
    return proc, conn


@contextlib.contextmanager
def _callers_script_hidden():
    """spawn runs the parent's __main__ again in the child (by its __spec__ name, or its
    __file__), so that pickled functions and classes of the script resolve there. The child's
    target lives in this module: without this, a script that embeds the trainer without an
    `if __name__ == "__main__":` guard started a second daemon in every learner process, which
    then failed in multiprocessing's bootstrapping (docs/trainer.md, "Run the trainer from a script").
    The preparation data is read in start(); the two attributes are back right after."""
    main = sys.modules.get("__main__")
    hidden = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    for k in hidden:
        if k == "__spec__":
            main.__spec__ = None
        else:
            del main.__dict__[k]
    try:
        yield
    finally:
        main.__dict__.update(hidden)


def refuse_in_learner_bootstrap() -> None:
    """Raises when called while a learner process runs the caller's script again (a learner
    class defined in the script): the script's daemon would start once more in every child."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError("a learner process is running your script again, because its learner class is "
                           "defined there (multiprocessing spawn imports the script): put the code that starts "
                           "the trainer under `if __name__ == \"__main__\":`, or move the learner class to a "
                           "module of its own")


def wait_any(processes: List[LearnerProcess], timeout: float) -> None:
    """Until one of the children sends something (or `timeout`)."""
    mp.connection.wait([p.conn for p in processes if p._dead is None], timeout)


# -------------------------------------------------------------------- the child

def _child_main(conn) -> None:
    # SIGINT and SIGTERM are ignored from the start (gcquiet.run_imported): the parent ends it.
    keep_freed_memory()   # each fragment's record and columns: a camera's megabytes a moment
    try:
        _serve(conn)
    except (EOFError, OSError):
        pass   # the parent is gone: nothing to report to
    except BaseException:   # noqa: BLE001 - the parent must hear why, then we exit
        try:
            conn.send_bytes(_ERROR + traceback.format_exc().encode())
        except OSError:
            pass
        raise SystemExit(1)


def _serve(conn) -> None:
    outbox = mailbox.Outbox(conn)
    try:
        _serve_rows(conn, outbox)
    finally:
        outbox.close()


def _serve_rows(conn, outbox: mailbox.Outbox) -> None:
    from simbridge.server.sample_batch import SampleBatch
    from simbridge.trainer.run.checkpoint import space_from_bytes

    msg = conn.recv_bytes()
    assert msg[:1] == _INIT
    init = state_from_bytes(msg[1:])
    if init["torch_threads"]:
        torch.set_num_threads(init["torch_threads"])
    # the learner's own lines (its update path, a GPU it shares) on this process's stderr, the daemon's
    logging.basicConfig(level=init.get("log_level", logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s (learner process): %(message)s")
    cls = _import(init["cls"])
    learner = cls(space_from_bytes(init["obs"]), space_from_bytes(init["act"]), config=init["config"],
                  device=init["device"], acting_device=init.get("acting_device"))
    learner.load_state_dict(init["state"])
    rows = reported = learner.agent_steps
    inbox = mailbox.Inbox(conn, last=_STOP)

    def report() -> None:
        w = {"acting": learner.acting.state_dict(), "updates": learner.updates, "forgiven": learner.updates_forgiven,
             "metrics": {k: float(v) for k, v in learner.last_metrics.items()}, "due": learner.updates_due(),
             "rows": rows}
        outbox.send(_WEIGHTS + state_bytes(w))

    while True:
        due = learner.updates_due()
        # Rows first (they may make updates due), but a steady stream of them must not starve training.
        for _ in range(64):
            msg = inbox.get(0 if due > 0 else 0.5)
            if msg is None:
                break
            tag = msg[:1]
            if tag == _ROWS:
                cols, n = records.decode_rows(memoryview(msg)[1:], checked=False)   # no copy of a camera's rows
                learner.add(SampleBatch(cols))
                rows += n
            elif tag == _STATE_Q:
                # The weights first: the parent then acts with the state's networks and version.
                report()
                reported = rows
                outbox.send(_STATE + state_bytes(learner.state_dict(include_replay=msg[1:2] == b"1")))
            elif tag == _STOP:
                return
            due = learner.updates_due()
        if due > 0:
            learner.train(max_updates=CHUNK)
        elif rows == reported:
            continue
        report()   # after updates, or rows that made none due: the parent learns how far the child got
        reported = rows
