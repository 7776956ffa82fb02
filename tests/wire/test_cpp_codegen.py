"""proto/ alone is enough for a code generator outside Python: a C++ client builds from it.

A new client in another language starts from a copy of proto/ and its own protoc. This copies
only proto/ into an empty directory, generates C++ with the system's protoc and gRPC plugin (no
include path but that copy: protoc's own well-known types, google/protobuf/*.proto, come with
every protoc), and compiles every generated file with g++ against the system headers.
"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTOC = "/usr/bin/protoc"
TOOLS = {"protoc": PROTOC, "grpc_cpp_plugin": "/usr/bin/grpc_cpp_plugin", "g++": shutil.which("g++")}


def _missing() -> list:
    return [name for name, path in TOOLS.items() if not path or not os.access(path, os.X_OK)]


def _proto_files(root: str) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, files in os.walk(root) for f in files if f.endswith(".proto"))


@pytest.mark.skipif(bool(_missing()), reason=f"needs Debian's protoc, grpc_cpp_plugin and g++ "
                                             f"(protobuf-compiler-grpc, libgrpc++-dev); missing: {_missing()}")
def test_cpp_client_code_compiles_from_proto_dir_alone(tmp_path):
    proto = tmp_path / "proto"
    shutil.copytree(os.path.join(ROOT, "proto"), proto)
    out = tmp_path / "gen"
    out.mkdir()
    files = _proto_files(str(proto))
    assert "simbridge/v1/simbridge.proto" in files
    assert "google/rpc/status.proto" in files, "the imported google.rpc.Status must ship in proto/"

    gen = subprocess.run([PROTOC, f"-I{proto}", f"--cpp_out={out}", f"--grpc_out={out}",
                          f"--plugin=protoc-gen-grpc={TOOLS['grpc_cpp_plugin']}", *files],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, f"protoc failed on a copy of proto/:\n{gen.stderr}"

    sources = sorted(str(p) for p in out.rglob("*.cc"))
    names = {os.path.relpath(s, out) for s in sources}
    assert {"simbridge/v1/simbridge.pb.cc", "simbridge/v1/simbridge.grpc.pb.cc",
            "google/rpc/status.pb.cc"} <= names
    stub = (out / "simbridge/v1/simbridge.grpc.pb.h").read_text()
    for service in ("class ExternalEnv", "class ExternalMultiAgentEnv"):
        assert service in stub
    # Through ccache where installed, its base directory this test's folder: the generated files of the
    # same proto/ hash alike in every run, so a run on this machine compiles only what changed since
    # the last (ccache replays a cached compile's diagnostics and exit code; CI starts bare, and compiles).
    ccache = shutil.which("ccache")
    env = {**os.environ, "CCACHE_BASEDIR": str(tmp_path)} if ccache else None
    for src in sources:
        cc = subprocess.run([*([ccache] if ccache else []), TOOLS["g++"], "-std=c++17", "-c",
                             f"-I{os.path.relpath(out, tmp_path)}", os.path.relpath(src, tmp_path),
                             "-o", os.path.relpath(src, tmp_path) + ".o"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert cc.returncode == 0, f"g++ failed on {os.path.relpath(src, out)}:\n{cc.stderr[-4000:]}"
