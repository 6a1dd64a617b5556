"""A small ONNX graph builder for the built-in models: exporter-style names, deterministic output."""

from __future__ import annotations

from typing import Literal, overload

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
IR_VERSION = 10


class GraphBuilder:
    """Collects nodes and initializers; node names are scoped like torch's exporter (`/model/…/MatMul`)."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._consts = 0
        self._names: set[str] = set()

    def weight(self, name: str, array: np.ndarray) -> str:
        """Add an initializer; its name."""
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))  # 0-d stays 0-d
        return name

    def const(self, value, dtype=np.float32) -> str:
        """Add a scalar or small constant initializer; its name."""
        self._consts += 1
        return self.weight(f"const_{self._consts}", np.asarray(value, dtype=dtype))

    @overload
    def op(self, op_type: str, inputs: list[str], scope: str, outputs: Literal[1] = 1, **attrs) -> str: ...

    @overload
    def op(self, op_type: str, inputs: list[str], scope: str, outputs: int, **attrs) -> list[str]: ...

    def op(self, op_type: str, inputs: list[str], scope: str, outputs: int = 1, **attrs) -> str | list[str]:
        """One node named like the exporter names it; its output (or outputs, when more than one)."""
        name = f"{scope}/{op_type}"
        k = 1
        while name in self._names:  # `…/MatMul`, `…/MatMul_1`, like the exporter
            name = f"{scope}/{op_type}_{k}"
            k += 1
        self._names.add(name)
        outs = [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if outputs == 1 else outs

    def rename_output(self, value: str, new_name: str) -> str:
        """Give a node's output a graph-output name (`logits`, `present.0.key`)."""
        for node in self.nodes:
            node.output[:] = [new_name if o == value else o for o in node.output]
            node.input[:] = [new_name if i == value else i for i in node.input]
        return new_name

    def linear(self, x: str, scope: str, weight_name: str, weight: np.ndarray, bias: np.ndarray | None = None) -> str:
        """torch Linear as the exporter writes it: MatMul with the transposed weight, then Add."""
        w = self.weight(weight_name, weight.T)
        y = self.op("MatMul", [x, w], scope)
        if bias is not None:
            b = self.weight(weight_name.removesuffix(".weight") + ".bias", bias)
            y = self.op("Add", [y, b], scope)
        return y

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        """The ONNX model of the nodes and initializers built so far."""
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qrc")
        model.ir_version = IR_VERSION
        return model


def tensor(name: str, elem_type: int, shape: list) -> onnx.ValueInfoProto:
    """A graph input or output."""
    return helper.make_tensor_value_info(name, elem_type, shape)


FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def normal(rng: np.random.RandomState, shape, std: float) -> np.ndarray:
    """Seeded normal weights of a standard deviation, float32."""
    return (rng.standard_normal(shape) * std).astype(np.float32)
