"""Reference simulators for simbridge.

Each runs its own loop as an external process and talks to a simbridge server
(`simbridge-server`, or the trainer) with the Python client:

  * `simbridge-sim` (simbridge.sims.gym_sim): any gymnasium env, one or K copies stepped
    together with the batched client calls.
  * `simbridge-multiagent-sim` (simbridge.sims.multiagent_sim): a simultaneous-move
    multi-agent CartPole and a turn-based two-player Nim.
  * `simbridge-pixel-sim` (simbridge.sims.pixel_sim): Catch seen as a uint8 image, the visual task
    a convolutional encoder learns (simbridge-sim's options).
"""
