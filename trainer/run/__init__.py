"""Running one trainer: the learning loop, the learner process and its rate limiter, checkpoints,
the experience journal and recovery, the run directory, reporting, and the launch helpers the demo
and tests share. The daemon (trainer/daemon.py) puts these together."""
