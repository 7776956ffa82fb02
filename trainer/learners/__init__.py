"""Learners: DQN, SAC and PPO, the Learner base they share, their action heads, replay, n-step
returns, advantages, ONNX export and the one presets module. Nothing here knows the bridge, the
daemon or the config file: a learner is built from spaces and a dict."""
