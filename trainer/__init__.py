"""The trainer: learners (DQN, SAC) behind the bridge, and the daemon that runs them."""
