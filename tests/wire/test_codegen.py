"""The checked-in generated code must match the .proto files (run `make proto` to fix)."""
import filecmp
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_generated_code_in_sync(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_proto.py"), "--out", str(tmp_path)],
                   check=True)
    gen = tmp_path / "simbridge" / "wire" / "v1"
    names = sorted(n for n in os.listdir(gen) if n.endswith((".py", ".pyi")))
    assert names == ["simbridge_pb2.py", "simbridge_pb2.pyi", "simbridge_pb2_grpc.py"]
    stale = [n for n in names if not filecmp.cmp(gen / n, os.path.join(ROOT, "simbridge", "wire", "v1", n), shallow=False)]
    assert not stale, f"generated code is out of date with proto/: {stale}; run `make proto`"
