"""builtin:tiny-cnn — Conv/Relu/MaxPool ×2, Transpose, Reshape, Gemm ×2: passthrough propagation material."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.models.builtin.graph import FLOAT, GraphBuilder, normal, tensor


@dataclass(frozen=True)
class CnnSpec:
    """The sizes of a tiny CNN (`builtin:tiny-cnn`)."""
    channels: int = 16
    image: int = 32
    hidden: int = 128
    classes: int = 10
    seed: int = 0

    def problems(self) -> list[str]:
        """What is wrong with these sizes, as sentences."""
        return [f"image ({self.image}) must be a multiple of 4"] if self.image % 4 else []

    @property
    def flat(self) -> int:
        """Features entering the classifier."""
        return 2 * self.channels * (self.image // 4) ** 2


def weights(spec: CnnSpec) -> dict[str, np.ndarray]:
    """The seeded weights, by tensor name."""
    rng = np.random.RandomState(spec.seed)
    c = spec.channels
    return {
        "conv1.weight": normal(rng, (c, 3, 3, 3), (3 * 9) ** -0.5), "conv1.bias": normal(rng, (c,), 0.02),
        "conv2.weight": normal(rng, (2 * c, c, 3, 3), (c * 9) ** -0.5), "conv2.bias": normal(rng, (2 * c,), 0.02),
        "fc1.weight": normal(rng, (spec.hidden, spec.flat), spec.flat ** -0.5), "fc1.bias": normal(rng, (spec.hidden,), 0.02),
        "fc2.weight": normal(rng, (spec.classes, spec.hidden), spec.hidden ** -0.5),
        "fc2.bias": normal(rng, (spec.classes,), 0.02),
    }


def build_onnx(spec: CnnSpec):
    """The ONNX form."""
    g, w = GraphBuilder(), weights(spec)
    x = "pixel_values"
    for name in ("conv1", "conv2"):
        x = g.op("Conv", [x, g.weight(f"{name}.weight", w[f"{name}.weight"]), g.weight(f"{name}.bias", w[f"{name}.bias"])],
                 f"/{name}", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        x = g.op("MaxPool", [g.op("Relu", [x], f"/{name}_act")], f"/{name}_pool", kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Reshape", [g.op("Transpose", [x], "/flatten", perm=[0, 2, 3, 1]), g.const([0, -1], np.int64)], "/flatten")
    for name, act in (("fc1", True), ("fc2", False)):
        x = g.op("Gemm", [x, g.weight(f"{name}.weight", w[f"{name}.weight"]), g.weight(f"{name}.bias", w[f"{name}.bias"])],
                 f"/{name}", transB=1)
        if act:
            x = g.op("Relu", [x], f"/{name}_act")
    logits = g.rename_output(x, "logits")
    return g.model("tiny_cnn", [tensor("pixel_values", FLOAT, ["batch", 3, spec.image, spec.image])],
                   [tensor(logits, FLOAT, ["batch", spec.classes])])
