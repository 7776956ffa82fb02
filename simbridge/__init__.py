"""simbridge: train RL policies for simulators that run their own loop.

The package is five rooms, each importing only the rooms below it (tools/lint_imports.py):

- ``simbridge.wire``: the contract (generated code, tensor, space and value codecs, errors).
- ``simbridge.client``: the simulator SDK (imports ``wire`` only; no torch).
- ``simbridge.server``: the bridge service, sessions, episodes and experience (imports ``wire``).
- ``simbridge.trainer`` (folder ``trainer/``): learners and the trainer daemon (torch).
- ``simbridge.sims`` (folder ``sims/``): the reference simulators and the Unity connector,
  built on the client.

``simbridge.extras`` lets the console scripts name an optional extra that is not installed.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("simbridge")   # pyproject.toml's, as installed
except PackageNotFoundError:   # a checkout on sys.path, not installed
    __version__ = "0+unknown"
del PackageNotFoundError, version
