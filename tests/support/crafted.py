"""What an attacker would put in a checkpoint.pt: an object whose unpickling runs a shell command.
Tests save one and assert that the command never ran (checkpoints are loaded without pickle)."""
import os


class RunsACommand:
    """Unpickling this calls os.system: what a crafted checkpoint.pt did on --resume."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)
