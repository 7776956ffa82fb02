"""What a user sees when things go wrong, run as the user runs them: the real CLIs as processes,
real servers (a trainer, an HTTP server, a bare listening socket) on loopback. Each test asserts
the message a person reads names the fix, and that no raw gRPC or Python object text reaches them."""
import http.server
import os
import resource
import signal
import socket
import subprocess
import threading
import time

import pytest

from simbridge.trainer.config.trainer_config import parse_config
from simbridge.trainer.daemon import TrainerDaemon
from simbridge.trainer.run.launch import ROOT, Proc, child_env, free_port, python_module, start_server
from support.daemon import ANY, daemon_env, kill, metrics, start_sim, start_trainer
from support.signals import AT_A_TERMINAL, NEEDS_ENV_SIGNALS, UNDER_NOHUP, signal_state
from support.waits import wait

RAW = ("Traceback", "_MultiThreadedRendezvous", "add_port.cc", "debug_error_string", "<grpc.")


def _clean(text: str) -> None:
    for raw in RAW:
        assert raw not in text, f"{raw!r} reached the user:\n{text}"


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished (waited-for) children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _sim(address: str, *args, timeout=60):
    t0 = time.monotonic()
    out = subprocess.run(python_module("simbridge.sims.gym_sim", "--address", address, *args), capture_output=True,
                         text=True, timeout=timeout, env=child_env(), cwd=str(ROOT), stdin=subprocess.DEVNULL)
    return out, time.monotonic() - t0


def test_a_simulator_without_a_trainer_says_so_and_how_to_start_one():
    address = f"127.0.0.1:{free_port()}"
    out, _ = _sim(address, "--connect-timeout", "2")
    assert out.returncode == 2 and out.stdout == ""
    assert f"no simbridge trainer at {address} yet: nothing listens there (connection refused); waiting up to 2 s" \
        in out.stderr, out.stderr
    assert (f"simbridge-sim: error: no simbridge trainer at {address}: nothing listens there (connection refused): "
            f"start one with `simbridge-trainer run --address {address}`") in out.stderr, out.stderr
    _clean(out.stderr)


def test_an_http_port_and_a_missing_port_fail_at_once_and_read_differently():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{httpd.server_address[1]}"
        out, took = _sim(address, "--connect-timeout", "30")
    finally:
        httpd.shutdown()
    assert out.returncode == 2
    assert f"no simbridge trainer at {address}: an HTTP/1 server answers there" in out.stderr, out.stderr
    assert "not a gRPC server" in out.stderr and took < 20, (took, out.stderr)   # not the 30 s wait
    _clean(out.stderr)
    out, took = _sim("127.0.0.1", "--connect-timeout", "30")
    assert out.returncode == 2 and took < 20
    assert "address '127.0.0.1' has no port: pass HOST:PORT, e.g. 127.0.0.1:50051" in out.stderr, out.stderr
    out, _ = _sim("127.0.0.1:99999", "--connect-timeout", "30")   # gRPC dialled 99999 - 65536 and waited
    assert out.returncode == 2 and "port 99999 is past 65535" in out.stderr, out.stderr


def _listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def _tree(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*"))


def test_a_busy_port_is_one_line_at_once_and_the_logdir_stays_as_it_was(tmp_path):
    sock, address = _listening()
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "notes.txt").write_text("mine\n")
    before = _tree(logdir)
    try:
        before_cpu = _children_cpu_s()
        out = subprocess.run(python_module("simbridge.trainer.cli", "run", "--address", address, "--logdir", str(logdir)),
                             capture_output=True, text=True, timeout=60, env=child_env(), stdin=subprocess.DEVNULL)
        cpu = _children_cpu_s() - before_cpu
        assert out.returncode == 2
        assert out.stderr == (f"simbridge-trainer: error: could not bind {address}: another process is listening on "
                              f"that port: stop it, or pick another port with --address HOST:PORT (nothing was "
                              f"written to {logdir})\n"), out.stderr
        # Before torch and the learners load: the CLI's CPU time (~0.5 s here), not its wall time, which a
        # loaded machine stretches (8.6 s at load 15); importing torch alone costs ~3 s of CPU.
        assert cpu < 2.0, cpu
        assert _tree(logdir) == before
        # Embedded (the bind in TrainerDaemon.run, after the learners are built): the same.
        cfg = parse_config(f'[server]\naddress = "{address}"\n[run]\nlogdir = "{logdir}"\n'
                           f'[policies.p]\nalgorithm = "random"\n')
        assert TrainerDaemon(cfg).run() == 2
        assert _tree(logdir) == before
    finally:
        sock.close()


def test_an_idle_trainer_waits_aloud_once_and_a_reconnecting_simulator_reads_plainly(tmp_path):
    address = f"127.0.0.1:{free_port()}"

    def trainer(logdir):
        return start_server("trainer", python_module(
            "simbridge.trainer.cli", "run", "--address", address, "--logdir", str(logdir), "--log-level", "WARNING",
            "--set", "run.print_every_s=0.2", "--set", "run.learner_process=false"),   # what is said, not learnt
            address, timeout=60)

    first = trainer(tmp_path / "a")
    sim = None
    try:
        time.sleep(2.0)   # ~10 report intervals with nothing connected
        lines = list(first.lines)
        waiting = [x for x in lines if x.startswith("[trainer] waiting for simulators")]
        assert waiting == [f"[trainer] waiting for simulators on {address} (0 env steps so far; start one, e.g. "
                           f"`simbridge-sim --address {address}`)"], lines
        assert not any("env steps 0 (0/s)" in x for x in lines), lines
        sim = Proc("sim", python_module("simbridge.sims.gym_sim", "--address", address, "--print-every", "1000"),
                   env=child_env())
        deadline = time.monotonic() + 60
        while not any("return(10) default_policy" in x for x in first.lines):
            assert time.monotonic() < deadline and sim.poll() is None, list(first.lines) + list(sim.lines)
            time.sleep(0.1)
        line = [x for x in first.lines if "return(10)" in x][-1]
        assert "(100: " in line and "length(10) default_policy" in line, line
        assert first.stop(timeout=30) == 0
        second = trainer(tmp_path / "b")   # a restart: the simulator reconnects and goes on
        try:
            deadline = time.monotonic() + 60
            while not any("going on with new episodes" in x for x in sim.lines):
                assert time.monotonic() < deadline and sim.poll() is None, list(sim.lines)
                time.sleep(0.1)
        finally:
            assert sim.stop(timeout=20) == 0
            second.stop(timeout=30)
        text = "\n".join(sim.lines)
        assert f"connection to {address} broke (" in text, text
        _clean(text)
    finally:
        for p in (sim, first):
            if p is not None and p.poll() is None:
                p.stop(timeout=10)


def test_a_simulator_refused_for_its_spaces_is_said_on_both_consoles_with_the_fix(tmp_path):
    """Issue 27 #6: the refusal was only in metrics.jsonl, and the simulator's message named both
    spaces but no fix. Now the trainer's console says it (once per kind; a retrying simulator
    does not flood it), and both name the fix: a [mapping] rule to another policy id, or a
    trainer of their own for those spaces."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\naddress = "127.0.0.1:0"\n[run]\nlogdir = "{tmp_path / "run"}"\nprint_every_s = 0.2\n'
                   f'learner_process = false\n'   # what is said; a refused simulator's session started a child
                   f'[policies.default_policy]\nalgorithm = "dqn"\n'
                   f'observation_space = {{ type = "Box", low = -1.0, high = 1.0, shape = [4] }}\n'
                   f'action_space = {{ type = "Discrete", n = 2 }}\n')
    trainer = start_trainer(cfg, "--log-level", "WARNING", env=child_env())
    address = trainer.address
    try:
        outs = [_sim(address, "--env", "MountainCar-v0", "--connect-timeout", "30")[0] for _ in range(2)]
        deadline = time.monotonic() + 30
        while not any("refused a simulator" in x for x in trainer.lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)   # more report intervals: the line must not repeat
    finally:
        trainer.stop(timeout=30)
    for out in outs:
        assert out.returncode != 0 and "whose spaces are" in out.stderr, out.stderr
        assert '[mapping] rules = ["agent0=<policy id>"]' in out.stderr and "Box(-1.0, 1.0, (4,)" in out.stderr, \
            out.stderr
        _clean(out.stderr)
    said = [x for x in trainer.lines if "refused a simulator" in x]
    assert len(said) == 1, list(trainer.lines)
    assert said[0].startswith("[trainer] refused a simulator (SPACE_MISMATCH): agent "), said
    assert "Discrete(3)" in said[0] and "Discrete(2)" in said[0] and "[mapping] rules" in said[0], said


def _read_pty(master: int, until: str, timeout: float) -> str:
    """What the terminal shows until `until` appears (or the other side closes, or `timeout`)."""
    import select
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and until.encode() not in out:
        if select.select([master], [], [], 1.0)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:   # EIO: every process holding the terminal is gone
                break
            if not chunk:
                break
            out += chunk
    return out.decode(errors="replace")


@pytest.mark.skipif(not hasattr(os, "tcsetpgrp") or subprocess.run(["which", "make"], capture_output=True).returncode,
                    reason="needs make and POSIX terminals")
def test_ctrl_c_of_make_demo_at_a_terminal_exits_0(tmp_path):
    """Issue 27 #4: at a terminal, Ctrl-C signals the foreground process group: make as well as the
    demo, and make died of it (status 130) though the demo stopped in order and returned 0. Here
    `make demo` runs on a pseudo-terminal it controls, and Ctrl-C is typed there."""
    import pty
    logdir = tmp_path / "demo"
    pid, master = pty.fork()
    if pid == 0:   # the child: a session of its own on the terminal, as a login shell's job would be
        try:
            os.chdir(ROOT)
            # -o: never reinstall the venv here, however new pyproject.toml is
            os.execvpe("make", ["make", "-s", "-o", ".venv/.installed", "demo",
                                f"DEMO_ARGS=--seconds 120 --logdir {logdir}"], child_env())
        finally:
            os._exit(127)
    done, status = 0, 0
    try:
        text = _read_pty(master, "Ctrl-C stops early", 180)
        assert "Ctrl-C stops early" in text, text
        time.sleep(1.0)
        os.write(master, b"\x03")   # Ctrl-C, typed: the terminal signals its foreground group
        text += _read_pty(master, "\x00never", 120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not done:
            done, status = os.waitpid(pid, os.WNOHANG)
            time.sleep(0.2)
    finally:
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 0, f"make exited {os.waitstatus_to_exitcode(status)}:\n{text}"
    assert "demo: interrupted (Ctrl-C)" in text and "Interrupt" not in text.replace("interrupted", ""), text
    assert "checkpoint" in text and "Error" not in text, text   # stopped in order: the final checkpoint
    assert (logdir / "checkpoint.pt").exists() and (logdir / "learning_curves.png").exists()
    _clean(text)


def _processes_naming(text: str) -> list:
    """PIDs of this machine's processes whose command line holds `text` (a test's own temp path)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_demo_piped_into_a_reader_that_leaves_stops_its_trainer_and_simulators(tmp_path):
    """`make demo | head -3`: the demo's next print raised BrokenPipeError, which skipped its
    clean-up, and the trainer (a session of its own) ran on with nobody to stop it. Now it stops
    everything it started, in order, as on Ctrl-C."""
    logdir = str(tmp_path / "demo")
    demo = subprocess.Popen(python_module("simbridge.trainer.demo", "--seconds", "120", "--logdir", logdir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=str(ROOT))
    try:
        for _ in range(3):   # what `head -3` reads: the trainer has started by then
            assert demo.stdout.readline(), demo.stderr.read().decode(errors="replace")
        demo.stdout.close()
        assert demo.wait(timeout=90) == 0, demo.stderr.read().decode(errors="replace")
        deadline = time.monotonic() + 30
        while _processes_naming(logdir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_naming(logdir), "the demo's trainer was left running"
        assert (tmp_path / "demo" / "checkpoint.pt").exists()   # stopped in order: its final checkpoint
    finally:
        _kill_what_is_left(demo, logdir)


def _kill_what_is_left(demo, logdir: str, sims=()) -> None:
    """A demo test's cleanup: the demo, its trainer (whose command line names `logdir`) and the
    simulators `sims` (PIDs), where still running."""
    if demo.poll() is None:
        demo.kill()
        demo.wait()
    for pid in _processes_naming(logdir) + [p for p in sims if _running(p)]:
        os.kill(pid, signal.SIGKILL)


def _trainer_argv(logdir, learner_process: bool = False) -> list:
    """The embedded default config (DQN on CartPole) on a port of its own, learning in the daemon's
    loop unless learner_process."""
    return python_module("simbridge.trainer.cli", "run", "--address", ANY, "--logdir", str(logdir), "--log-level",
                         "WARNING", "--set", "run.print_every_s=0.2",
                         "--set", f"run.learner_process={str(learner_process).lower()}")


def _stopped_in_order(logdir) -> None:
    assert metrics(logdir)[-1]["event"] == "stop", metrics(logdir)[-1:]
    assert (logdir / "checkpoint.pt").exists()


def _leave_and_see_it_stop(trainer: subprocess.Popen, logdir, timeout: float) -> None:
    """Close the trainer's stdout as `head` does once it has its lines; it must stop in order."""
    trainer.stdout.close()
    try:
        code = trainer.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("the trainer ran on after its console's reader left")
    err = trainer.stderr.read()
    assert code == 0 and "Traceback" not in err, err
    _stopped_in_order(logdir)


def test_a_trainer_whose_console_reader_leaves_stops_in_order(tmp_path):
    """`simbridge-trainer run | head`, or the demo that read its output killed: the next progress line
    raised BrokenPipeError, which ended the learning loop; the shutdown's first line raised again
    before the server stopped, and the process hung at exit (RPC threads waiting for room in an
    experience queue nobody drained), with no final checkpoint and no stop record. Now the reader
    leaving stops the run as SIGTERM does (simbridge/console.py)."""
    logdir = tmp_path / "run"
    trainer = subprocess.Popen(_trainer_argv(logdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=daemon_env(), cwd=str(ROOT))
    sim = None
    try:
        seen = []
        while not any("listening on" in x for x in seen):
            seen.append(trainer.stdout.readline())
            assert seen[-1], "".join(seen)
        address = [x for x in seen if "listening on" in x][0].split("listening on ")[1].split()[0]
        sim = start_sim("gym_sim", "simbridge.sims.gym_sim", address)
        while not any(x.startswith("[trainer] env steps") and "episodes" in x for x in seen):
            seen.append(trainer.stdout.readline())
            assert seen[-1], "".join(seen)
        _leave_and_see_it_stop(trainer, logdir, timeout=30)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        kill(sim)


def test_an_idle_trainer_whose_console_reader_leaves_stops_without_waiting_for_its_next_line(tmp_path):
    """`simbridge-trainer run | head` with no simulator: the trainer noticed the reader gone only when
    it next printed, its "waiting for simulators" line every 30 s (newcomer audit: 35.6 s to stop)."""
    logdir = tmp_path / "run"
    trainer = subprocess.Popen(_trainer_argv(logdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=daemon_env(), cwd=str(ROOT))
    try:
        seen = []
        while not any("waiting for simulators" in x for x in seen):
            seen.append(trainer.stdout.readline())
            assert seen[-1], "".join(seen)
        _leave_and_see_it_stop(trainer, logdir, timeout=20)   # its next waiting line was 30 s away
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()


@NEEDS_ENV_SIGNALS
@pytest.mark.parametrize("nohup", [False, True], ids=["terminal-closed", "nohup"])
def test_sighup_stops_a_trainer_in_order_unless_ignored_as_under_nohup(tmp_path, nohup):
    """A terminal closed under `simbridge-trainer run` (SIGHUP) killed it at once: no final checkpoint,
    no stop record. Now SIGHUP stops it as SIGTERM does; under nohup (SIGHUP ignored) it runs on."""
    logdir = tmp_path / "run"
    trainer = start_server("trainer", [*(UNDER_NOHUP if nohup else AT_A_TERMINAL), *_trainer_argv(logdir)], ANY,
                           timeout=60, env=daemon_env())
    try:
        trainer.popen.send_signal(signal.SIGHUP)
        if nohup:
            time.sleep(1.0)
            assert trainer.poll() is None, "\n".join(trainer.lines)
            assert trainer.stop(timeout=30) == 0
        else:
            assert trainer.popen.wait(timeout=30) == 0, "\n".join(trainer.lines)
            trainer.wait_output()
            assert any("stopping (SIGHUP)" in x for x in trainer.lines), list(trainer.lines)
        _stopped_in_order(logdir)
    finally:
        kill(trainer)


@NEEDS_ENV_SIGNALS
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_demos_still_stopping_line_from_its_signal_handler_takes_no_lock(monkeypatch):
    """A second Ctrl-C while the demo stops says "still stopping". Its handler runs in the main
    thread, which may be inside the console's print holding its lock: through that print, the
    handler waited for the lock forever (the demo hung). It writes to the descriptor instead."""
    import sys
    from simbridge.trainer import demo
    r, w = os.pipe()
    os.set_blocking(r, False)   # a line not written fails the read below instead of waiting
    monkeypatch.setattr(sys, "stdout", os.fdopen(w, "w"))
    console = demo._Console()

    def handler_inside_print():   # the main thread holding the lock, where the handler runs
        with console._lock:
            console.say_from_a_signal_handler("still stopping")
    t = threading.Thread(target=handler_inside_print, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the handler's line waited for the lock its own thread held"
    assert os.read(r, 100) == b"demo: still stopping\n"


def test_sighup_to_the_demo_stops_its_trainer_and_simulators(tmp_path):
    """`python -m simbridge.trainer.demo` at a terminal that closes: the shell's SIGHUP killed the demo
    at once, and its trainer and simulators (sessions of their own, so no SIGHUP for them) ran on.
    Now the demo stops them in order, as on Ctrl-C."""
    logdir = str(tmp_path / "demo")
    demo = subprocess.Popen([*AT_A_TERMINAL, *python_module("simbridge.trainer.demo", "--seconds", "120",
                                                            "--logdir", logdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=str(ROOT))
    sims = []
    try:
        said = []
        while not any("Ctrl-C stops early" in x for x in said):
            said.append(demo.stdout.readline())
            assert said[-1], "".join(said)
        demo.send_signal(signal.SIGHUP)
        sims = [int(x.split(" pid ")[1].split()[0]) for x in said if x.startswith("demo: ") and " pid " in x]
        said += demo.stdout.readlines()
        assert demo.wait(timeout=60) == 0, "".join(said)
        assert any("demo: interrupted (SIGHUP)" in x for x in said), "".join(said)
        assert len(sims) == 2 and not [p for p in sims if _running(p)], "the demo's simulators were left running"
        assert not _processes_naming(logdir), "the demo's trainer was left running"
        assert (tmp_path / "demo" / "checkpoint.pt").exists()   # stopped in order: its final checkpoint
    finally:
        _kill_what_is_left(demo, logdir, sims)


def _stat(pid: int) -> list:
    """/proc/PID/stat's fields after the command name (state, parent, ...); [] for a process gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _running(pid: int) -> bool:
    """A live process (not a zombie that nobody has reaped yet)."""
    return _stat(pid)[:1] not in ([], ["Z"])


def _learner_processes_of(pid: int) -> list:
    """PIDs of the learner processes (multiprocessing's spawned children) whose parent is `pid`; not
    its resource tracker, which ends by itself a moment after the trainer."""
    return [p for p in _processes_naming("spawn_main") if _stat(p)[1:2] == [str(pid)]]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_second_ctrl_c_while_the_trainer_stops_ends_it_and_its_learner_processes_at_once(tmp_path):
    """Ctrl-C, then Ctrl-C again while the trainer writes its final checkpoint ("interrupted again:
    exiting without a final checkpoint"): the process never exited. Its learner processes ignore
    SIGINT and SIGTERM (the trainer asks them for their state at a stop), and multiprocessing waited
    for them at exit. Now the second signal kills them."""
    logdir = tmp_path / "run"
    # faulthandler: a trainer that does not exit is made to show where (below)
    trainer = start_server("trainer", _trainer_argv(logdir, learner_process=True), ANY, timeout=60,
                           env={**daemon_env(), "PYTHONFAULTHANDLER": "1"}, keep=3000)
    sim = None
    try:
        sim = start_sim("gym_sim", "simbridge.sims.gym_sim", trainer.address, "--slots", "4")

        def learning():
            recs = metrics(logdir)
            return recs and recs[-1].get("updates", {}).get("default_policy", 0) > 0
        wait(learning, 60, "the learner process's first updates", [trainer, sim])
        learners = _learner_processes_of(trainer.pid)
        trainer.popen.send_signal(signal.SIGINT)
        # the second while the first stop is under way: its server stop waits 0.5 s for the open stream
        wait(lambda: any("stopping (SIGINT)" in x for x in trainer.lines), 30, "the first stop", [trainer])
        trainer.popen.send_signal(signal.SIGINT)
        try:
            code = trainer.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            state = signal_state(trainer.pid)
            trainer.popen.send_signal(signal.SIGABRT)   # every thread's stack, from faulthandler
            try:
                trainer.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
            trainer.wait_output()
            pytest.fail(f"the trainer did not exit after a second Ctrl-C ({state}): " + "\n".join(trainer.lines))
        trainer.wait_output()
        assert code == 130 and any("interrupted again" in x for x in trainer.lines), (code, list(trainer.lines))
        # the first stop's line said how to cut it short
        assert any("writing the checkpoint (Ctrl-C again: at once, without it)" in x for x in trainer.lines)
        assert learners and not [p for p in learners if _running(p)], "its learner processes were left running"
    finally:
        kill(trainer, sim)
