"""Mode auto: planner (each round's proposer and draft length), profile (the device's
calibrated costs it reads), calibrate (the measuring that writes them).

planner and profile sit below the engine; calibrate runs the engine, so it is a measurer
(tests/unit/test_layout.py holds the layer of each)."""
