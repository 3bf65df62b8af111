"""Planning every round, in every mode: costs (the one cost model of this device), planner (each
round's proposer and draft length; a fixed mode is the planner held to one proposer), rounds (what
the engine calls: it makes the draft the planner names), profile (the device's calibrated costs
that the cost model starts from). The measuring that writes profiles is bench/calibrate.py."""
