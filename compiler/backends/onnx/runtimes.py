"""Where the ONNX backend's outputs run (compiler/ir/runtimes.py): onnxruntime on each device, and onnxruntime-genai
for a decoder the backend writes genai's files beside. Torch- and onnxruntime-free: `qrc check` fills the table
from the format and the model's JSON side files. The CPU claims are run by tests/test_runtimes.py over the same
table (docs/runtimes.md); the GPU ones are onnxruntime's rules (its CUDA execution provider), not run here."""

from __future__ import annotations

from compiler.backends.onnx.export_decoder import DECODER_FAMILIES
from compiler.backends.onnx.genai import genai_runs
from compiler.backends.onnx.support import dequantized_int8
from compiler.ir.kinds import EmitFormat
from compiler.ir.runtimes import Device, Evidence, Runtime, RuntimeCell
from compiler.ir.types import RecipeIR
from compiler.models import local_path
from compiler.models.index import ModelFormat
from compiler.resolve.assignment import Assignment


def onnx_runtimes(ir: RecipeIR, assignment: Assignment) -> tuple[RuntimeCell, ...]:
    """The emitted ONNX model in onnxruntime (CPU, CUDA) and, for a decoder with genai's files, onnxruntime-genai."""
    fmt = ir.emit.format if ir.emit is not None else EmitFormat.QDQ
    if fmt is EmitFormat.MATMUL_NBITS:
        level = ir.emit.accuracy_level if ir.emit is not None else 4
        how = f"MatMulNBits, accuracy_level {level}"
    else:
        how = "QDQ pairs fused into integer kernels where onnxruntime fuses them"
    slow = dequantized_int8(assignment, fmt)
    if slow:
        how += f"; {len(slow)} layers' int8 inputs run dequantized, in float (x86 kernels take uint8: Q437)"
    cells = [RuntimeCell(Runtime.ONNXRUNTIME, Device.CPU, True, how, Evidence.TESTED),
             RuntimeCell(Runtime.ONNXRUNTIME, Device.GPU, True, "CUDA execution provider (onnxruntime-gpu)",
                         Evidence.RULES)]
    path = local_path(assignment.model.ref)
    folder = None if path is None else (path if path.is_dir() else path.parent)
    # an HF folder is exported by qrc, with a key/value cache for the decoder families it exports
    exported = assignment.model.family in DECODER_FAMILIES if assignment.model.format is ModelFormat.HF else None
    if folder is not None and genai_runs(folder, assignment.model, exported):
        cells += [RuntimeCell(Runtime.GENAI, Device.CPU, True, "genai_config.json and the tokenizer beside it",
                              Evidence.TESTED),
                  RuntimeCell(Runtime.GENAI, Device.GPU, True, "its CUDA build reads the same files", Evidence.RULES)]
    else:
        why = "not a decoder onnxruntime-genai runs: no genai_config.json is written beside it"
        cells += [RuntimeCell(Runtime.GENAI, d, False, why, Evidence.RULES) for d in Device]
    return tuple(cells)
