"""How a learned rotation's run is laid out (torch/spinquant.py), shared with the plan's time (torch/timing.py), so
`qrc plan` reads it without importing torch."""

from __future__ import annotations

VALIDATIONS = 5  # how often over the run the held-out calibration samples are run to choose the rotation kept
HELD_OUT = 8  # one calibration sample in this many is held out of the steps to choose it (at least one)
