"""Calibration and verification data, backend-neutral: chunks of model inputs as numpy arrays.

Both backends read their samples here (synthetic, npz, tokenised text); new sources (datasets, chat
templates, images) belong in this package, not in a backend."""

from compiler.data.batches import Batches, calibration_batches, load_npz, load_text, verify_batches

__all__ = ["Batches", "calibration_batches", "load_npz", "load_text", "verify_batches"]
