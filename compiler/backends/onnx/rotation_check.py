"""What `transform quarot` needs on the ONNX backend, beyond what any backend needs of the model (resolve/rotation.py):
a graph whose every reader and writer of the residual stream is one the rotation folds (onnx/rotation_structure.py),
checked when the graph is known (an .onnx file, or a folder's cached export; a folder exported later is checked
when its export is opened), and no search beside it."""

from __future__ import annotations

from compiler.backends.onnx.rotation_structure import fold_of
from compiler.diagnostics import Diagnostics
from compiler.ir.types import RecipeIR
from compiler.resolve.assignment import Assignment
from compiler.resolve.rotation import rotation_to_check


def check_rotation(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q273 for each thing the rotation cannot take on this graph."""
    transform = rotation_to_check(ir, assignment.model, diags)
    if transform is None or assignment.model.graph is None:
        return
    fold = fold_of(assignment.model)
    if isinstance(fold, str):
        diags.error("Q273", f"`transform {transform.kind.name}` cannot rotate this graph: {fold}", transform.span,
                    "no rotation here", help="rotations fold into Llama-family decoders as exporters write them "
                    "(onnxruntime-genai's builder, torch.onnx); `backend torch` rotates the folder itself")
