"""`format gguf`: one file llama.cpp, Ollama and LM Studio run (docs/gguf.md). Its layers are rounded to the
file's own blocks (float16 scales, or the e2m1 formats' own) on every rank (gguf_writer.GgufLayout), so that qrc's model, which
verification runs, computes what llama.cpp decodes; it has no folder for transformers to check. The methods only
a compile calls import the writer (torch, the `gguf` package) when called."""

from __future__ import annotations

from compiler.backends.torch.cost import COPY_SLICE
from compiler.backends.torch.formats import TORCH_FORMATS, Opened
from compiler.backends.torch.gguf_check import check_gguf
from compiler.backends.torch.runtimes import gguf_runtimes

# GGUF's rounding, bytes a weight of the largest layer (file to file, beyond a copy slice): the weight as float32
# and the blocks' float32 temporaries. llama.cpp's reference Q4_0/Q8_0 (the gguf package's numpy port), measured on
# random Llamas whose largest layers hold 0.79M and 3.1M weights: 37 and 95 MiB above the runtime (26 a weight);
# qrc's K-quants, which search candidate scales: Q4_K 40 and Q6_K 45 a weight on the 3.1M one
GGUF_ROUNDING, GGUF_KQUANT_ROUNDING = 26, 46


@TORCH_FORMATS.register
class GgufFile:
    """The GGUF writer, its block encoding and its checks."""

    name = "gguf"
    one_file = True
    path_help = "a .gguf file path with `format gguf`"
    emit_example = '`emit "out.gguf" { format gguf }`'
    opened_by_transformers = False
    verified_on = "qrc's model, rounded to the GGUF's blocks (their scales and codes, the values llama.cpp decodes)"
    planned_verified_on = "qrc's model rounded to the GGUF's blocks (the values llama.cpp decodes)"
    rounded_copy_verified = True
    encodes_whole_tensors = True  # its types' encodings read the whole tensor

    @staticmethod
    def check(ir, assignment, diags):
        """What llama.cpp's file cannot hold, and the architectures it runs (gguf_check.py)."""
        check_gguf(ir, assignment, diags)

    @staticmethod
    def runtimes(assignment):
        """llama.cpp, and transformers' GGUF loader (runtimes.py)."""
        return gguf_runtimes(assignment)

    @staticmethod
    def keeps_own(qtype) -> bool:
        """The K-quants are GGUF's own."""
        return qtype.is_kquant

    @staticmethod
    def open(target, staged, resumed, attention):
        """The layout of every tensor (every rank encodes the layers it rounds); the first rank writes the header
        now, with every tensor's place, the others hand their tensors on."""
        from compiler.backends.torch.gguf_writer import GgufLayout, GgufWriter
        from compiler.backends.torch.writer import RankCollector

        layout = GgufLayout(target.model, target.jobs, target.assignment.model.packed_experts)
        writer = GgufWriter(target.output, target.model, layout, staged, resumed, target.plan.provenance) \
            if target.ranks.first else RankCollector()
        return Opened(writer, layout, unit_global=layout.unit_global)

    @staticmethod
    def copies_beside_rounding(staging):
        """None: GGUF's float types are converted at emit."""
        return None

    @staticmethod
    def finish(staging, checked):
        """Every checkpoint tensor no layer replaced, converted to its GGUF type (the first rank)."""
        from compiler.backends.torch.gguf_writer import GgufWriter

        if isinstance(staging.writer, GgufWriter):
            staging.writer.copy_unquantized(staging.model, staging.jobs)
        return []

    @staticmethod
    def check_staged(staging, checked):
        """Nothing: llama.cpp's own load is a test's (tests/test_gguf.py)."""
        return None

    @staticmethod
    def rounding_scratch(w) -> int:
        """Rounding the largest layer to GGUF's blocks: qrc's K-quant search or llama.cpp's reference Q4_0/Q8_0.
        Its reference blocks are rounded between the block's float and rounded forwards of the held-out stream,
        and are held with them: added whole (measured 0.99-1.02x on a hidden-512 Llama, 1-16 held-out samples)."""
        names = set(w.quantized_layers)
        largest = max((x.params for x in w.index.layers if x.name in names), default=0)
        return (GGUF_KQUANT_ROUNDING if w.kquant_rounded else GGUF_ROUNDING) * largest

    @staticmethod
    def file_scratch(w):
        """The same rounding, file to file, beside one slice of a copied tensor (the FP4 types' compiled loop is a
        library the runtime counts)."""
        return GgufFile.rounding_scratch(w) + COPY_SLICE
