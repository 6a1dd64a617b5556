"""Numerics shared by the backends: qparams, weight rounding, int4 packing, streaming observers (numpy only)."""
