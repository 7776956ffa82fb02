"""The bridge as other libraries' environments: a gymnasium VectorEnv (vector_env.py, its
simulators' side in step_hub.py) and an SB3 VecEnv (sb3.py), for trainers that are not
simbridge's own."""
