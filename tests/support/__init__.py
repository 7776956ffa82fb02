"""Helpers that several test files share, one concept per module (issue 24): waits (the bounded
wait), daemon (the trainer daemon as a process), group (a data-parallel group on two hosts), learning
(a learning run through the bridge), raw (hand-made gRPC requests), experience (what a server
collected), batches (fragments acted by a learner), datasets (tiny Minari datasets), crafted (a
checkpoint payload that runs a command).

tests/ is on sys.path while pytest runs (tests/conftest.py sits there, with no __init__.py), so a
test in any folder imports them as `from support.waits import wait`. No file here is named test_*:
pytest collects none of them.
"""
