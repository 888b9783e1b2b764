"""Cost models: how long an iteration of a batch takes, for the simulator."""
