"""simbridge: train RL policies for simulators that run their own loop.

The package is four rooms, each importing only the rooms below it:

- ``simbridge.wire``: the contract (generated code, tensor and space codecs, errors).
- ``simbridge.client``: the simulator SDK (imports ``wire`` only; no torch).
- ``simbridge.server``: the bridge service, sessions, episodes and experience.
- ``simbridge.trainer`` (folder ``trainer/``): learners and the trainer daemon (torch).

``simbridge.sims`` (folder ``sims/``) holds the reference simulators and the Unity connector,
built on the client.
"""
__version__ = "0.1.0"
