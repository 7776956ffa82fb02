"""A data-parallel group of trainers: a rank's identity and joining the group (ranks.py), the
exchange of gradients and weights (group.py), and the group's learning loop (loop.py)."""
