"""The trainer's configuration: the TOML file and `--set` overrides -> typed dataclasses
(trainer_config.py), its sections, spaces, algorithms and dataset table, and the writer of the
effective config. Imports the learners only to resolve an algorithm's defaults."""
