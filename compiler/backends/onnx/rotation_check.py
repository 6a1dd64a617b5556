"""What `transform quarot` needs on the ONNX backend, beyond what any backend needs of the model (resolve/rotation.py):
a graph whose every reader and writer of the residual stream is one the rotation folds (onnx/rotation_structure.py;
R4 alone after SmoothQuant's fold: down projections whose inputs a node makes),
checked when the graph is known (an .onnx file, or a folder's cached export; a folder exported later is checked
when its export is opened), no search beside it, and room for the rotated copy in its scratch folder; and room for
SmoothQuant's or AWQ's smoothed copy likewise (onnx/smoothing.py writes it before anything else too)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from compiler.backends.onnx.rotation_structure import downs_of, fold_of
from compiler.diagnostics import Diagnostics
from compiler.ir.types import RecipeIR
from compiler.ir.values import human_bytes
from compiler.ram_folders import memory_filesystem
from compiler.resolve.assignment import Assignment
from compiler.resolve.rotation import check_online_only, online_only, rotation_to_check
from compiler.safe_files import nearest_existing
from compiler.source import Span


def _check_downs(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q273 where R4 alone, after the smoothing's fold, cannot turn the down projections (what any backend needs:
    resolve/rotation.py), or the graph has none to turn (the graph known: an .onnx file, or a folder's cached
    export)."""
    if not check_online_only(ir, assignment.model, diags):
        return
    downs = downs_of(assignment.model) if assignment.model.graph is not None else None
    if isinstance(downs, str):
        assert ir.transform is not None
        diags.error("Q273", f"`online r4` cannot turn this graph: {downs}", ir.transform.span_of("online") or
                    ir.transform.span, "nothing to turn", help="drop `online r4`")


def _scratch_folder(ir: RecipeIR) -> Path:
    """Where the run's copies of the model go (onnx/files.py new_scratch): `memory { disk }`, else TMPDIR; the
    nearest folder of it that exists, where its room and file system are."""
    return nearest_existing(Path(ir.memory.disk) if ir.memory.disk else Path(tempfile.gettempdir()))


def _check_room(ir: RecipeIR, assignment: Assignment, diags: Diagnostics, what: str) -> None:
    """Q417 where the folder the `what` copy of the model goes to (`memory { disk }`, else TMPDIR: onnx/files.py
    new_scratch) has no room for one more copy of its weights; it is written before anything else. Q453 where that
    folder is a tmpfs TMPDIR (held_in_memory)."""
    assert ir.transform is not None
    scratch = _scratch_folder(ir)
    needed, free = assignment.model.total_bytes, shutil.disk_usage(scratch).free
    held_in_memory(ir, diags, f"the {what} copy of the model", needed, ir.transform.span)
    if free < needed:
        diags.error("Q417", f"the {what} copy of the model needs about {human_bytes(needed)} in `{scratch}`, which "
                    f"has {human_bytes(free)} free", ir.transform.span, f"no room for the {what} copy",
                    help="give `memory { disk \"…\" }` a folder with room for one more copy of the model's weights "
                    "(without it, the copy goes to the temporary folder: TMPDIR)")


def held_in_memory(ir: RecipeIR, diags: Diagnostics, what: str, size: int, span: Span | None) -> None:
    """Q453 (a warning) where `what` (a copy of `size` bytes) goes to the temporary folder and that is a tmpfs:
    memory beside the plan's peak. A `memory { disk }` copy goes there instead; ir/checks.py says when that is one."""
    if ir.memory.disk:
        return
    scratch = _scratch_folder(ir)
    kind = memory_filesystem(scratch)
    if kind is not None:
        diags.warning("Q453", f"{what} (about {human_bytes(size)}) goes to the temporary folder `{scratch}`, a "
                      f"{kind}: it is held in RAM, beside the planned peak", span or ir.span, f"a {kind} is memory",
                      help="give `memory { disk \"…\" }` a folder on a disk (or set TMPDIR to one): the copy is "
                      "written there instead")


def check_inline_split(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q453 where the model's weights are inside its .onnx file, which the run first splits into a data file in the
    temporary folder (onnx/files.py open_model), and that folder is a tmpfs."""
    if assignment.model.inline_bytes:
        held_in_memory(ir, diags, "the split of the model's weights out of its .onnx file",
                       assignment.model.inline_bytes, ir.model_span)


def check_rotation(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q273 for each thing the rotation cannot take on this graph; Q417 where the scratch folder has no room for
    the rotated or the smoothed copy, Q453 where it is memory."""
    if ir.transform is not None and assignment.smoothing:  # the smoothed copy (onnx/smoothing.py), R4 or not
        _check_room(ir, assignment, diags, "smoothed")
    if online_only(ir):
        _check_downs(ir, assignment, diags)
        return
    transform = rotation_to_check(ir, assignment.model, diags)
    if transform is None:
        return
    _check_room(ir, assignment, diags, "rotated")
    if assignment.model.graph is None:
        return
    fold = fold_of(assignment.model)
    if isinstance(fold, str):
        diags.error("Q273", f"`transform {transform.kind.name}` cannot rotate this graph: {fold}", transform.span,
                    "no rotation here", help="rotations fold into Llama-family decoders as exporters write them "
                    "(onnxruntime-genai's builder, torch.onnx); `backend torch` rotates the folder itself")
