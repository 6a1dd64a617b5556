"""The GGUF types qrc writes and the schemes that are one, the decoder families and the tokenizers llama.cpp
reads from qrc's files: shared by `qrc check` (gguf_check.py) and the writer. No torch, no gguf import."""

from __future__ import annotations

import enum
import re

from compiler.ir.types import Granularity, QType, Scheme

# transformers' model_type → llama.cpp's architecture (Mistral's dense decoders and Mixtral's experts are Llama's
# graph there)
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mixtral": "llama",
                 "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss"}
# the RoPE scalings the writer carries into the file, per architecture (gguf_metadata.add_rope_scaling): gpt-oss's
# YaRN, which its graph in llama.cpp reads; any other scaling is refused at check
ROPE_SCALINGS = {"gpt-oss": ("yarn",)}
# the architectures whose llama.cpp graph multiplies merged experts by no `.scale` (gpt-oss's passes none to its MoE
# FFN; measured: a file whose expert scales were tripled ran the same logits), so NVFP4 experts there carry their
# whole range in their block scales: their global scale is 1 and no `.scale` is written beside them
UNSCALED_EXPERTS = frozenset({"gpt-oss"})
# an MoE expert's projection (`….experts.7.gate_proj`): llama.cpp holds a block's experts of one projection as one
# merged tensor [experts, rows, columns] (`ffn_gate_exps`), each expert's rows a slice of it
EXPERT = re.compile(r"\.experts\.(\d+)\.")


def merged_expert(name: str) -> tuple[str, int] | None:
    """`….experts.7.gate_proj.weight` → (`….experts.gate_proj.weight`, 7): the merged tensor's transformers-style
    name (what llama.cpp's name map knows) and the expert's index in it; None for any other tensor."""
    found = EXPERT.search(name)
    if found is None:
        return None
    return f"{name[:found.start()]}.experts.{name[found.end():]}", int(found.group(1))


class GgufType(enum.Enum):
    """The GGUF tensor types qrc writes (named as llama.cpp names them)."""
    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    Q8_0 = "Q8_0"  # int8 symmetric, blocks of 32 along the input, a float16 scale each
    Q4_0 = "Q4_0"  # int4 symmetric (stored +8), blocks of 32, a float16 scale each
    Q4_K = "Q4_K"  # the K-quants (compiler/quant/kquants.py): rows of whole super-blocks of 256 weights
    Q5_K = "Q5_K"
    Q6_K = "Q6_K"
    MXFP4 = "MXFP4"  # e2m1 in blocks of 32 with an E8M0 scale: `MXFP4A16` weights, gpt-oss's MXFP4 experts
    # e2m1 in blocks of 16 with an unsigned E4M3 scale each, four to a super-block of 64; beside each tensor an F32
    # `.scale` (per expert in a merged one) that llama.cpp multiplies its product by: `NVFP4A16` weights
    NVFP4 = "NVFP4"


K_QUANTS = {QType.Q4_K: GgufType.Q4_K, QType.Q5_K: GgufType.Q5_K, QType.Q6_K: GgufType.Q6_K}
SUPER_BLOCK = 256  # a K-quant row is cut into super-blocks of this many weights
NVFP4_SUPER_BLOCK = 64  # an NVFP4 row: super-blocks of four blocks of 16
FLOAT_FORMATS = {QType.NVFP4: GgufType.NVFP4, QType.MXFP4: GgufType.MXFP4}
TYPES_HELP = ("GGUF's types: Q8_0 is `weights int8 group 32 symmetric`, Q4_0 `weights int4 group 32 symmetric`, "
              "Q4_K/Q5_K/Q6_K `weights q4_k`/`q5_k`/`q6_k`, NVFP4 and MXFP4 the `NVFP4A16` and `MXFP4A16` presets")


def gguf_type(scheme: Scheme) -> GgufType | str:
    """The GGUF type a weight-only scheme is, or why it is none."""
    if scheme.weights is None:
        return "its weights stay float (GGUF has no quantized-input-only type)"
    if scheme.activations is not None:
        return "GGUF stores weights; llama.cpp quantizes the inputs itself (remove `activations`)"
    spec = scheme.quantized_weights
    if spec.qtype in K_QUANTS:  # the scheme check (ir/schemes.py) fixed their sub-blocks and symmetry
        return K_QUANTS[spec.qtype]
    if spec.qtype in FLOAT_FORMATS:  # ... and the microscaling formats' blocks
        return FLOAT_FORMATS[spec.qtype]
    forms = {QType.INT8: GgufType.Q8_0, QType.INT4: GgufType.Q4_0}
    if spec.qtype not in forms:
        return f"`{spec.qtype.name}` weights have no GGUF type qrc writes"
    if spec.granularity is not Granularity.GROUP or spec.group_size != 32 or not spec.symmetric:
        where = f"group {spec.group_size}" if spec.granularity is Granularity.GROUP else spec.granularity.value
        return f"{spec.qtype.name} {where} {'symmetric' if spec.symmetric else 'asymmetric'} is no GGUF type"
    return forms[spec.qtype]


def token_ids(tokenizer: dict) -> dict[int, str]:
    """tokenizer.json's tokens by id: its model's vocabulary, then its added tokens (an added token takes its id)."""
    by_id = {int(i): t for t, i in (tokenizer.get("model") or {}).get("vocab", {}).items()}
    by_id.update({int(t["id"]): t["content"] for t in tokenizer.get("added_tokens", [])})
    return by_id


def pre_tokenizer(tokenizer: dict) -> str | None:
    """llama.cpp's name (`tokenizer.ggml.pre`) for the way `tokenizer` splits text before BPE, or None when it is
    none of the patterns llama.cpp knows by that name. Llama 3 and Qwen2 split with one regex each (they differ
    in digits: up to three together, or one at a time), GPT-2 with the byte-level pre-tokenizer's own, GPT-4o
    (gpt-oss) with case-aware letter runs."""
    found = tokenizer.get("pre_tokenizer") or {}
    steps = found.get("pretokenizers", [found]) if found.get("type") == "Sequence" else [found]
    for step in steps:
        if step.get("type") == "ByteLevel" and step.get("use_regex", True):
            return "gpt-2"
        if step.get("type") == "Split":
            regex = (step.get("pattern") or {}).get("Regex", "")
            # GPT-4o's (o200k: gpt-oss): case-aware letter runs, each with its contraction as a suffix; it holds
            # Llama 3's two marks too, so it is told apart first
            if "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]" in regex and "\\p{N}{1,3}" in regex and \
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?" in regex:
                return "gpt-4o"
            if "\\p{N}{1,3}" in regex and "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in regex:
                return "llama-bpe"
            if "|\\p{N}|" in regex and "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in regex:
                return "qwen2"
    return None
