"""The built-in calibration methods, one module each (compiler/ir/methods.py says what a method provides).
Importing this package registers them; `compiler` imports it, so every entry point has them."""

from compiler.quant.methods import entropy, layerwise_percentile, minmax, mse, percentile

__all__ = ["entropy", "layerwise_percentile", "minmax", "mse", "percentile"]
