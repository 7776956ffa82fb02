"""The C++ SDK over TLS, mutual TLS and with a token, end to end: the built examples (cartpole,
cartpole_slots, the MuJoCo pendulum) against a real bridge runtime on loopback whose gRPC server
serves TLS with certificates made here by trustme and checks "authorization: Bearer <token>".

What must hold: episodes arrive over TLS and mutual TLS; a server certificate the client's CA did
not sign, or one for another name, fails at once (not after connect_timeout_s) with UNAVAILABLE and a
message naming TLS and the CA file; a client without an accepted certificate is refused by a mutual
TLS server; a wrong or missing token is UNAUTHENTICATED / AUTH_FAILED and the session is never
created; the token travels on the unary calls (GetPolicy) as on the stream; a missing token or PEM
file is named in the error before any connection is tried."""
import json
import os
import socket
import subprocess
import time

import grpc
import pytest
import trustme

from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.security import ServerSecurity
from simbridge.server.service import BridgeServer

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED.value[0]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
TOKEN = "s3cret-token-for-tests"


# ---------------------------------------------------------------- the bridge with TLS and tokens

@pytest.fixture
def serve(tmp_path):
    """Real BridgeServers with ServerSecurity (the settings of simbridge-server's --tls-cert, --tls-key,
    --tls-client-ca and --auth-token-file), stopped at teardown."""
    served = []

    def _serve(tls=None, token=None, runtime=None, address="127.0.0.1:0"):
        """tls: (server LeafCert, client CA or None): with a client CA the server requires client certificates."""
        d = tmp_path / f"server{len(served)}"
        d.mkdir()
        security = ServerSecurity()
        if tls:
            cert, client_ca = tls
            (d / "cert.pem").write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
            cert.private_key_pem.write_to_path(str(d / "key.pem"))
            security.tls_cert, security.tls_key = str(d / "cert.pem"), str(d / "key.pem")
            if client_ca is not None:
                client_ca.cert_pem.write_to_path(str(d / "client_ca.pem"))
                security.tls_client_ca = str(d / "client_ca.pem")
        if token:
            (d / "tokens").write_text(token + "\n")
            security.auth_token_file = str(d / "tokens")
        s = BridgeServer(runtime or BridgeRuntime(BridgeConfig(rollout_fragment_length=16)), address,
                         security=security).start()
        s.address = f"127.0.0.1:{s.port}"
        served.append(s)
        return s

    yield _serve
    for s in served:
        s.stop(grace=0)


# ---------------------------------------------------------------- certificates, files, runs

class Pki:
    def __init__(self, root):
        self.ca, self.client_ca, self.other_ca = trustme.CA(), trustme.CA(), trustme.CA()
        self.server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.named = self.ca.issue_cert("bridge.simbridge.test")        # for --tls-server-name only
        self.client = self.client_ca.issue_cert("sim-1.simbridge.test")
        self.rogue_client = self.other_ca.issue_cert("sim-1.simbridge.test")
        self.files = {}
        for name, ca in (("ca", self.ca), ("client_ca", self.client_ca), ("other_ca", self.other_ca)):
            self.files[name] = str(root / f"{name}.pem")
            ca.cert_pem.write_to_path(self.files[name])
        for name, leaf in (("client", self.client), ("rogue_client", self.rogue_client)):
            self.files[f"{name}_cert"] = str(root / f"{name}.pem")
            self.files[f"{name}_key"] = str(root / f"{name}.key")
            with open(self.files[f"{name}_cert"], "wb") as f:
                f.write(b"".join(p.bytes() for p in leaf.cert_chain_pems))
            leaf.private_key_pem.write_to_path(self.files[f"{name}_key"])
        self.files["token"] = str(root / "token")
        with open(self.files["token"], "w") as f:
            f.write(f"  {TOKEN}\n")                      # surrounding whitespace is not the token's
        self.files["wrong_token"] = str(root / "wrong_token")
        with open(self.files["wrong_token"], "w") as f:
            f.write("not-the-token\n")

    def __getitem__(self, name):
        return self.files[name]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def _run(build, program, *args, env=None, timeout=60):
    start = time.monotonic()
    full_env = {k: v for k, v in os.environ.items() if k != "SIMBRIDGE_AUTH_TOKEN"}
    full_env.update(env or {})
    out = subprocess.run([os.path.join(build, program), *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, env=full_env)
    out.seconds = time.monotonic() - start
    return out


def _summary(out):
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cartpole(build, srv, *flags, episodes=2, **kw):
    return _run(build, "cartpole", "--address", srv.address, "--episodes", episodes, *flags, **kw)


# ---------------------------------------------------------------- TLS

def test_tls_lockstep_and_slots_deliver_every_step(cpp_build, serve, pki):
    srv = serve(tls=(pki.server, None))
    lockstep = _summary(_cartpole(cpp_build, srv, "--tls-ca", pki["ca"], episodes=3))
    slots = _summary(_run(cpp_build, "cartpole_slots", "--address", srv.address, "--steps", 50, "--slots", 4,
                          "--tls-ca", pki["ca"]))
    snap = srv.runtime.snapshot()
    assert lockstep["episodes"] == 3 and slots["steps"] == 200
    assert snap["env_steps"] == lockstep["steps"] + 200 and snap["sessions"] == 0


def test_plaintext_client_and_tls_server_fail_fast_saying_so(cpp_build, serve, pki):
    srv = serve(tls=(pki.server, None))
    out = _cartpole(cpp_build, srv)
    assert out.returncode == 1 and out.seconds < 5                # not the 30 s connect timeout
    assert "closed every connection during the handshake" in out.stderr and "--tls-ca" in out.stderr
    assert f"(SERVER_UNAVAILABLE) [gRPC status {UNAVAILABLE}]" in out.stderr
    plain = serve()
    out = _cartpole(cpp_build, plain, "--tls-ca", pki["ca"])
    assert out.returncode == 1 and out.seconds < 5 and "TLS handshake" in out.stderr
    assert srv.runtime.snapshot()["sessions"] == plain.runtime.snapshot()["sessions"] == 0


def test_tls_client_waits_for_a_server_that_starts_late(cpp_build, serve, pki):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.Popen([os.path.join(cpp_build, "cartpole"), "--address", address, "--episodes", "1",
                             "--tls-ca", pki["ca"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)                                           # refused connections meanwhile: not final
        assert proc.poll() is None
        srv = serve(tls=(pki.server, None), address=address)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1])["episodes"] == 1 and srv.runtime.snapshot()["episodes"] == 1


def test_server_certificate_from_another_ca_fails_fast_naming_tls_and_the_ca(cpp_build, serve, pki):
    srv = serve(tls=(pki.server, None))
    out = _cartpole(cpp_build, srv, "--tls-ca", pki["other_ca"])
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.seconds < 5                                    # not the 30 s connect timeout
    assert "TLS handshake" in out.stderr and pki["other_ca"] in out.stderr
    assert f"(SERVER_UNAVAILABLE) [gRPC status {UNAVAILABLE}]" in out.stderr
    assert srv.runtime.snapshot()["env_steps"] == 0


def test_server_name_override_checks_the_certificate_against_that_name(cpp_build, serve, pki):
    srv = serve(tls=(pki.named, None))                 # a certificate for bridge.simbridge.test only
    refused = _cartpole(cpp_build, srv, "--tls-ca", pki["ca"])
    assert refused.returncode == 1 and refused.seconds < 10 and "TLS handshake" in refused.stderr
    ok = _summary(_cartpole(cpp_build, srv, "--tls-ca", pki["ca"], "--tls-server-name", "bridge.simbridge.test"))
    assert ok["episodes"] == 2


# ---------------------------------------------------------------- mutual TLS

def test_mutual_tls_serves_a_client_with_an_accepted_certificate_only(cpp_build, serve, pki):
    srv = serve(tls=(pki.server, pki.client_ca))
    ok = _summary(_run(cpp_build, "cartpole_slots", "--address", srv.address, "--steps", 20, "--slots", 2,
                       "--tls-ca", pki["ca"], "--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"]))
    assert ok["steps"] == 40
    for flags in ([], ["--tls-cert", pki["rogue_client_cert"], "--tls-key", pki["rogue_client_key"]]):
        out = _cartpole(cpp_build, srv, "--tls-ca", pki["ca"], *flags)
        assert out.returncode == 1 and out.seconds < 5, out.stderr
        assert "closed every connection during the handshake" in out.stderr and "--tls-cert" in out.stderr
        assert f"(SERVER_UNAVAILABLE) [gRPC status {UNAVAILABLE}]" in out.stderr
    snap = srv.runtime.snapshot()
    assert snap["env_steps"] == 40 and snap["sessions"] == 0


# ---------------------------------------------------------------- tokens

def test_token_right_wrong_missing_over_tls(cpp_build, serve, pki):
    srv = serve(tls=(pki.server, None), token=TOKEN)
    ok = _summary(_cartpole(cpp_build, srv, "--tls-ca", pki["ca"], "--auth-token-file", pki["token"]))
    assert ok["episodes"] == 2
    steps = srv.runtime.snapshot()["env_steps"]
    for flags in (["--auth-token-file", pki["wrong_token"]], []):
        out = _cartpole(cpp_build, srv, "--tls-ca", pki["ca"], *flags)
        assert out.returncode == 1 and out.seconds < 10
        assert f"(AUTH_FAILED) [gRPC status {UNAUTHENTICATED}]" in out.stderr, out.stderr
        assert TOKEN not in out.stderr
    snap = srv.runtime.snapshot()
    assert snap["env_steps"] == steps and snap["sessions"] == 0     # the refused never got a session


def test_token_on_plaintext_loopback_and_from_the_environment(cpp_build, serve, pki):
    srv = serve(token=TOKEN)
    assert _summary(_run(cpp_build, "cartpole_slots", "--address", srv.address, "--steps", 10, "--slots", 2,
                         env={"SIMBRIDGE_AUTH_TOKEN": TOKEN}))["steps"] == 20
    refused = _cartpole(cpp_build, srv, env={"SIMBRIDGE_AUTH_TOKEN": "wrong"})
    assert f"(AUTH_FAILED) [gRPC status {UNAUTHENTICATED}]" in refused.stderr
    # The file wins over the environment.
    assert _summary(_cartpole(cpp_build, srv, "--auth-token-file", pki["token"],
                              env={"SIMBRIDGE_AUTH_TOKEN": "wrong"}))["episodes"] == 2


def test_a_token_refused_on_reconnect_is_auth_failed_not_a_lost_server(cpp_build, serve, pki):
    """The server restarts (same runtime, same port) with another token: the client's resume is
    refused, and it says so with AUTH_FAILED instead of retrying or calling the server lost."""
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=16))
    first = serve(token=TOKEN, runtime=rt)
    proc = subprocess.Popen([os.path.join(cpp_build, "cartpole"), "--address", first.address, "--episodes", "100000",
                             "--auth-token-file", pki["token"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 20
        while rt.snapshot()["env_steps"] < 50 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None and rt.snapshot()["env_steps"] >= 50
        first.stop()
        serve(token="rotated-token", runtime=rt, address=first.address)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "refused to resume session" in stderr and f"(AUTH_FAILED) [gRPC status {UNAUTHENTICATED}]" in stderr


def test_get_policy_carries_the_token_too(cpp_build, serve, pki):
    """--inference local downloads the policy with the unary GetPolicy: refused without the token."""
    from simbridge.trainer.learners.dqn import DQNLearner
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=16),
                       policy_factory=lambda pid, o, a: DQNLearner(o, a, config={"hidden": [8], "seed": 0},
                                                                   device="cpu"))
    srv = serve(tls=(pki.server, pki.client_ca), token=TOKEN, runtime=rt)
    summary = _summary(_cartpole(cpp_build, srv, "--inference", "local", "--tls-ca", pki["ca"],
                                 "--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"],
                                 "--auth-token-file", pki["token"]))
    assert summary["policy_version"] == 0 and rt.snapshot()["env_steps"] == summary["steps"]


# ---------------------------------------------------------------- files named before connecting

@pytest.mark.parametrize("flags, named", [
    (["--auth-token-file", "/nonexistent/token"], "auth_token_file '/nonexistent/token'"),
    (["--tls-ca", "/nonexistent/ca.pem"], "tls_ca_file '/nonexistent/ca.pem'"),
    (["--tls-ca", "TOKEN_FILE"], "not a PEM file (no -----BEGIN line)"),
    (["--tls-cert", "CLIENT_CERT"], "tls_cert_file and tls_key_file go together"),
])
def test_missing_or_wrong_files_are_named_at_once(cpp_build, pki, flags, named):
    flags = [pki["token"] if f == "TOKEN_FILE" else pki["client_cert"] if f == "CLIENT_CERT" else f for f in flags]
    out = _run(cpp_build, "cartpole", "--address", "127.0.0.1:1", *flags)     # nothing listens there
    assert out.returncode == 1 and out.seconds < 5
    assert named in out.stderr and "(INVALID_REQUEST)" in out.stderr, out.stderr


def test_mujoco_pendulum_takes_the_same_flags(cpp_build, serve, pki):
    sim = os.path.join(cpp_build, "mujoco", "mujoco_pendulum_sim")
    if not os.path.exists(sim):
        pytest.skip("MuJoCo is not installed: mujoco_pendulum_sim was not built")
    srv = serve(tls=(pki.server, pki.client_ca), token=TOKEN)
    out = _run(cpp_build, sim, "--address", srv.address, "--max-steps", 30, "--tls-ca", pki["ca"],
               "--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"], "--auth-token-file", pki["token"])
    assert _summary(out)["env_steps"] == 30 and srv.runtime.snapshot()["env_steps"] == 30
