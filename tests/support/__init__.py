"""Helpers that several test files share, one concept per module (issue 24): waits, the trainer
daemon as a process, a raw gRPC client with request builders, and the learning runs of tests/e2e.

tests/ is on sys.path while pytest runs (tests/conftest.py sits there, with no __init__.py), so a
test in any folder imports them as `from support.waits import wait`. No file here is named test_*:
pytest collects none of them.
"""
