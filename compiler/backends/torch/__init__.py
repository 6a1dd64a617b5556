"""The PyTorch backend: block-wise quantization with weights streamed from safetensors, emitted in the
compressed-tensors layout."""
