"""The benchmarks and the fuzzer: scripts run as `python bench/<name>.py` from the checkout, and the
modules they share (harness, sims, echo, cases, ratios, cpp_cases; fuzzing, fuzzcases, fuzzrig, fuzzjudge).

A package so that tests import `bench.fuzzing` and the rest (pytest puts the checkout on the path:
pyproject.toml's [tool.pytest.ini_options] pythonpath); a script puts the checkout on the path itself.
"""
