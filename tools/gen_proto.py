"""Regenerate simbridge/wire/v1/*_pb2*.py from proto/ (run via `make proto`).

Also used by tests/test_codegen.py to check that the checked-in code is in
sync with the .proto files: `python tools/gen_proto.py --out DIR` writes the
generated tree under DIR instead of the repository.
"""
import argparse
import os
import sys

import grpc_tools
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(ROOT, "proto")
PROTOS = ["simbridge/v1/simbridge.proto"]


def generate(out_dir: str) -> None:
    """protoc names the Python modules after the proto's path (simbridge/v1/...); they live in
    the wire room, simbridge/wire/v1/, so the output is moved there and the one import that
    names the module's package is rewritten."""
    import shutil
    import tempfile
    tmp = tempfile.mkdtemp()
    _protoc(tmp)
    dest = os.path.join(out_dir, "simbridge", "wire", "v1")
    os.makedirs(dest, exist_ok=True)
    src = os.path.join(tmp, "simbridge", "v1")
    for name in sorted(os.listdir(src)):
        with open(os.path.join(src, name)) as f:
            text = f.read().replace("from simbridge.v1 import", "from simbridge.wire.v1 import")
        with open(os.path.join(dest, name), "w") as f:
            f.write(text)
    shutil.rmtree(tmp)


def _protoc(out_dir: str) -> None:
    # proto/ holds everything the contract imports beyond protoc's own well-known types
    # (google/protobuf/*.proto, which grpc_tools ships as every protoc does): google/rpc/status.proto
    # is vendored there, so any language's generator needs only proto/ and its protoc.
    includes = [PROTO_DIR, os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")]
    args = ["protoc"] + [f"-I{p}" for p in includes]
    args += [f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}"]
    args += PROTOS
    if protoc.main(args) != 0:
        sys.exit("protoc failed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=ROOT)
    generate(parser.parse_args().out)
