"""The trainer daemon and the reference simulator over TLS with a token, as processes, with
certificates made here (trustme); simulators without the token, or trusting another CA, are
turned away with an error that names the fix, and the trainer serves on."""
import json
import subprocess
import sys

import pytest
import trustme

from simbridge.trainer.run.launch import child_env, free_port, stop_all

CONFIG = """
[server]
address = "{address}"
rollout_fragment_length = 16
tls_cert = "{cert}"
tls_key = "{key}"
auth_token_file = "{tokens}"
[run]
logdir = "{logdir}"
print_every_s = 0.5
[policies.default_policy]
algorithm = "random"
"""


@pytest.fixture
def pki(tmp_path):
    ca, other = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    files = {k: tmp_path / f"{k}.pem" for k in ("ca", "other", "cert", "key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    other.cert_pem.write_to_path(str(files["other"]))
    leaf.private_key_pem.write_to_path(str(files["key"]))
    files["cert"].write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
    files["tokens"] = tmp_path / "tokens"
    files["tokens"].write_text("fleet-token-0123456789\n")
    return {k: str(v) for k, v in files.items()}


def _sim(address, *extra, episodes=5):
    return [sys.executable, "-m", "simbridge.sims.gym_sim", "--address", address, "--quiet",
            "--episodes", str(episodes), "--seed", "0", "--connect-timeout", "60", *extra]


@pytest.mark.timeout(120)
def test_trainer_and_simulator_over_tls_with_a_token(tmp_path, pki):
    port = free_port()
    address = f"localhost:{port}"
    logdir = tmp_path / "run"
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(CONFIG.format(address=f"127.0.0.1:{port}", cert=pki["cert"], key=pki["key"],
                                 tokens=pki["tokens"], logdir=logdir))
    env = child_env()
    daemon = subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(cfg)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        good = subprocess.run(_sim(address, "--tls-ca", pki["ca"], "--auth-token-file", pki["tokens"]),
                              env=env, capture_output=True, text=True, timeout=90)
        assert good.returncode == 0, good.stderr
        summary = json.loads(good.stdout.strip().splitlines()[-1])
        assert summary["episodes"] == 5

        no_token = subprocess.run(_sim(address, "--tls-ca", pki["ca"]), env=env, capture_output=True,
                                  text=True, timeout=60)
        assert no_token.returncode == 2
        assert "requires a token" in no_token.stderr and "--auth-token-file" in no_token.stderr
        assert "Traceback" not in no_token.stderr

        wrong_ca = subprocess.run(_sim(address, "--tls-ca", pki["other"], "--auth-token-file", pki["tokens"],
                                       "--connect-timeout", "3"),
                                  env=env, capture_output=True, text=True, timeout=60)
        assert wrong_ca.returncode == 2 and "TLS" in wrong_ca.stderr and "Traceback" not in wrong_ca.stderr
        # gRPC's own INFO lines ("... ssl_transport_security.cc ... Handshake failed", twice) no longer
        # surround the client's words (newcomer audit)
        assert "Handshake failed" not in wrong_ca.stderr, wrong_ca.stderr

        again = subprocess.run(_sim(address, "--tls-ca", pki["ca"], "--auth-token-file", pki["tokens"],
                                    episodes=2), env=env, capture_output=True, text=True, timeout=90)
        assert again.returncode == 0, again.stderr   # the trainer served on
    finally:
        stop_all([daemon], timeout=30)
    out = daemon.stdout.read()
    assert "fleet-token" not in out   # the token is never logged
    records = [json.loads(x) for x in (logdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    final = records[-1]
    assert final["episodes"] == 7 and final["env_steps"] == summary["steps"] + json.loads(
        again.stdout.strip().splitlines()[-1])["steps"]
