"""`format safetensors`: compressed-tensors' folder (sharded safetensors, config.json with its
quantization_config, the model folder's side files), which transformers and vLLM load. The torch backend's
default output (formats.py). `qrc check` and `qrc plan` import this module: the methods only a compile calls
import the writer's modules (torch, transformers) when called."""

from __future__ import annotations

from compiler.backends.torch.formats import TORCH_FORMATS, Opened
from compiler.backends.torch.runtimes import folder_runtimes
from compiler.backends.torch.support import check_compressed_tensors
from compiler.diagnostics import warning


@TORCH_FORMATS.register
class SafetensorsFolder:
    """The folder writer, its config and load checks, and what it copies as bytes."""

    name = "safetensors"
    one_file = False
    path_help = "safetensors output"
    emit_example = "`emit \"FOLDER\" { format safetensors }`"
    opened_by_transformers = True
    verified_on = ""
    planned_verified_on = ""
    rounded_copy_verified = False
    encodes_whole_tensors = False

    @staticmethod
    def check(ir, assignment, diags):
        """What compressed-tensors cannot store, and what vLLM will not load (support.py)."""
        check_compressed_tensors(ir, assignment, diags)

    @staticmethod
    def runtimes(assignment):
        """transformers and vLLM, by the folder's schemes (runtimes.py)."""
        return folder_runtimes(assignment)

    @staticmethod
    def keeps_own(qtype) -> bool:
        """No weight type is stored by this format alone."""
        return False

    @staticmethod
    def open(target, staged, resumed, attention):
        """config.json checked with compressed-tensors' schema and the folder laid out (output_layout.py); file
        to file, the final config and the load check start on a thread (early_check.py)."""
        from compiler.backends.release import freeze_long_lived
        from compiler.backends.torch.early_check import EarlyCheck
        from compiler.backends.torch.output_layout import open_output
        from compiler.backends.torch.writer import FolderWriter

        config, writer, skipped = open_output(
            target.output, target.model, target.jobs, target.assignment, target.plan.emit.kv_cache, attention,
            target.plan.spans.recipe, target.ranks.first, provisional=target.file_to_file, staged=staged, reopen=resumed)
        freeze_long_lived()  # the output's layout imported transformers' model classes: later collections skip them
        early = None
        if target.file_to_file and isinstance(writer, FolderWriter):  # while the weights round
            assert target.check_process is not None  # load() started it: this is the first rank's folder
            early = EarlyCheck(target.model, target.jobs, target.assignment, config, writer,
                               (target.plan.spans.recipe, target.plan.spans.emit), target.check_process)
        return Opened(writer, None, config, skipped, early)

    @staticmethod
    def copies_beside_rounding(staging):
        """The bytes copied unchanged, beside the rounding rather than after it (an FP8 source's weights left
        float are dequantized at emit: their float32 copy would add to the rounding's peak)."""
        from compiler.backends.torch.output_layout import copy_unquantized
        from compiler.backends.torch.writer import FolderWriter

        writer = staging.writer
        if not isinstance(writer, FolderWriter) or staging.model.shards.scaled:
            return None
        return lambda: copy_unquantized(writer, staging.model, staging.jobs)

    @staticmethod
    def finish(staging, checked):
        """The first rank copies what was not rounded and writes config.json (its final names, file to file),
        the recipe and the side files; the others hand their tensors on and write nothing."""
        from compiler.backends.torch.output_layout import copy_unquantized, write_metadata
        from compiler.backends.torch.writer import FolderWriter

        if not isinstance(staging.writer, FolderWriter):
            return []
        warnings = []
        copy_unquantized(staging.writer, staging.model, staging.jobs)
        if checked is not None:  # the config with the final names
            staging.config = checked.config
            if checked.config_warning is not None:
                warnings.append(checked.config_warning)
        refused = write_metadata(staging.writer, staging.model, staging.config, staging.plan.recipe_text)
        if refused:
            warnings.append(warning(
                "Q430", f"{len(refused)} file(s) of the model folder link outside it and were not copied: "
                f"{', '.join(refused[:4])}", staging.plan.spans.model, "not copied",
                help="copy the real files into the model folder if the output should carry them"))
        return warnings

    @staticmethod
    def check_staged(staging, checked):
        """What transformers makes of the staged folder (the first rank's: the others write nothing)."""
        from compiler.backends.torch.load_check import check_loads
        from compiler.backends.torch.writer import FolderWriter

        if staging.model.folder is None or not isinstance(staging.writer, FolderWriter):
            return None
        if checked is not None:
            return checked.load_warning
        return check_loads(staging.writer.temp, staging.model.folder, staging.plan.spans.emit)

    @staticmethod
    def rounding_scratch(w) -> int:
        """Nothing beyond the backend's own rounding."""
        return 0

    @staticmethod
    def file_scratch(w):
        """The backend's own estimate (cost.py)."""
        return None
