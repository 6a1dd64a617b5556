"""What a GGUF output can hold, found by `qrc check` before any work: the decoder families llama.cpp runs
from qrc's writer, the schemes that are a GGUF type, and a tokenizer llama.cpp can read from the file. Reads
config.json and tokenizer.json only (no weights, no torch, no gguf import)."""

from __future__ import annotations

import json
from pathlib import Path

from compiler.backends.torch.fused_experts_check import warn_fused_experts
from compiler.backends.torch.gguf_types import (
    ARCHITECTURES,
    NVFP4_SUPER_BLOCK,
    ROPE_SCALINGS,
    SUPER_BLOCK,
    TYPES_HELP,
    GgufType,
    gguf_type,
    merged_expert,
    pre_tokenizer,
    token_ids,
)
from compiler.diagnostics import Diagnostics
from compiler.ir.types import RecipeIR
from compiler.models.index import ROUTER_OP
from compiler.models.side_files import copyable
from compiler.resolve.assignment import Assignment
from compiler.resolve.choices import each_choice
from compiler.safe_files import read_json

# the types whose rows are cut into super-blocks, and their weights
SUPER_BLOCKS = {GgufType.Q4_K: SUPER_BLOCK, GgufType.Q5_K: SUPER_BLOCK, GgufType.Q6_K: SUPER_BLOCK,
                GgufType.NVFP4: NVFP4_SUPER_BLOCK}


# where the refused layers include MoE experts: the rule that gives them a type of their own
EXPERTS_HELP = ("; a rule after it gives the experts their own, e.g. `\"*.experts.*\" -> MXFP4A16`, or `-> none`, which "
                "keeps an MXFP4 source's experts MXFP4 as llama-quantize leaves them")


def check_gguf(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q439 for a model the GGUF writer cannot hold, Q438 for each layer × scheme that is no GGUF type."""
    assert ir.emit is not None  # the format is the emit's
    span = ir.emit.span_of("format") or ir.emit.span_of("path")
    model = assignment.model
    problem = _model_problem(model.ref, model.family)
    if problem:
        diags.error("Q439", f"GGUF output: {problem}", ir.model_span or span, "no GGUF for this model",
                    help=f"GGUF is written for {', '.join(sorted(ARCHITECTURES))} decoders in an HF folder with a "
                    "BPE tokenizer.json; use `format safetensors` for the others")
    if not problem:
        warn_fused_experts(ir, assignment, diags)
    if ir.kv_cache is not None:
        diags.error("Q438", "GGUF output: llama.cpp sets its KV cache's type at run time (`--cache-type-k`)",
                    ir.kv_cache.span, "no KV cache in GGUF", help="remove `kv_cache`")
    seen: set[tuple[str, str]] = set()
    for candidate in each_choice(ir, assignment):
        merged: dict[str, dict[object, str]] = {}  # a merged expert tensor → each type its experts get → one expert
        refused: dict[tuple[str, str], list] = {}  # (scheme, why) → its layers: one error each, not one a layer
        for a in candidate.layers:
            found = None if a.scheme.is_none else gguf_type(a.scheme)
            size = SUPER_BLOCKS.get(found) if isinstance(found, GgufType) else None
            if isinstance(found, GgufType) and size and a.layer.in_features % size:
                found = f"{found.value} takes rows of whole super-blocks of {size} weights; this layer's rows " \
                    f"have {a.layer.in_features}"
            if found is not None and a.layer.op == ROUTER_OP:
                found = "llama.cpp keeps an MoE router in float (`ffn_gate_inp`; llama-quantize never rounds it)"
            if isinstance(found, str) and (a.layer.name, a.scheme.name) not in seen:
                seen.add((a.layer.name, a.scheme.name))
                refused.setdefault((a.scheme.name, found), []).append(a)
            expert = merged_expert(a.layer.name)
            if expert is not None and not isinstance(found, str):
                merged.setdefault(expert[0], {}).setdefault(found, a.layer.name)
        for (scheme, why), layers in refused.items():
            first = layers[0]
            more = f" (and {len(layers) - 1:,} more layer{'s' if len(layers) > 2 else ''} like it)" if len(layers) > 1 else ""
            experts = any(merged_expert(a.layer.name) for a in layers)
            diags.error("Q438", f"`{first.layer.name}`{more} with scheme `{scheme}`: {why}",
                        first.rule.span if first.rule else first.scheme.span, "no GGUF type",
                        help=TYPES_HELP + (EXPERTS_HELP if experts else ""))
        for name, kinds in merged.items():
            if len(kinds) > 1 and name not in {n for n, _ in seen}:
                seen.add((name, ""))
                listed = ", ".join(f"`{layer}` {getattr(kind, 'value', 'float')}" for kind, layer in kinds.items())
                diags.error("Q438", f"the experts of `{name}` get different GGUF types ({listed}): llama.cpp holds "
                            "a block's experts of one projection as one merged tensor of one type",
                            ir.emit.span_of("format") or ir.emit.span_of("path"), "no GGUF type",
                            help="give every expert of a projection the same scheme (rules such as "
                            "`\"*.experts.*.down_proj\" -> q8` do)")


def _model_problem(ref: str, family: str) -> str | None:
    """Why the GGUF writer cannot hold the model at `ref`, or None."""
    from compiler.data.dataset_schema import model_folder

    folder = model_folder(ref)
    if folder is None:
        return f"`{ref}` is not a transformers folder (GGUF carries the folder's tokenizer)"
    if family not in ARCHITECTURES:
        return f"a `{family}` model (llama.cpp's graph for it is not one qrc writes)"
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    routing = _routing_problem(family, text)
    if routing:
        return routing
    for key in ("rope_parameters", "rope_scaling"):  # both: transformers applies `rope_scaling` where a user added it
        rope = text.get(key) or config.get(key)
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if kind not in ("default", None, *ROPE_SCALINGS.get(ARCHITECTURES[family], ())):
            return f"RoPE scaling `{kind}` in `{key}` (qrc writes plain RoPE only, and gpt-oss's YaRN)"
    rows = text.get("vocab_size")
    return tokenizer_problem(folder, rows if isinstance(rows, int) else None)


def _routing_problem(family: str, config: dict) -> str | None:
    """Why llama.cpp's MoE graph would compute another model than this config's, or None. Its Qwen3-MoE graph
    renormalises the chosen experts' weights and makes every block an MoE block."""
    if family != "qwen3_moe":
        return None
    if config.get("norm_topk_prob") is False:
        return ("`norm_topk_prob: false` (llama.cpp's Qwen3-MoE graph always renormalises the chosen experts' "
                "weights, so the file would compute another model)")
    if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step") or 1) != 1:
        return "dense MLP blocks between the MoE blocks (`mlp_only_layers`, `decoder_sparse_step`): llama.cpp's " \
            "Qwen3-MoE graph makes every block an MoE block"
    return None


def tokenizer_problem(folder: Path, vocab_size: int | None = None) -> str | None:
    """Why `folder`'s tokenizer cannot go into a GGUF, or None (a byte-level BPE tokenizer.json whose ids are rows
    of the embedding: llama.cpp's token table has `vocab_size` entries, the embedding's rows)."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return f"`{folder}` has no tokenizer.json (llama.cpp reads the tokenizer from the GGUF file)"
    if not copyable(folder, path):
        return "tokenizer.json links outside the model folder"
    try:
        tokenizer = read_json(path, TOKENIZER_LIMIT)
    except (OSError, ValueError) as exc:  # too large, not JSON, nested past the parser
        return f"tokenizer.json cannot be read ({exc})"
    try:  # a file of another shape (a list, ids that are no integers, entries lacking one) is a problem, not a crash
        model = tokenizer.get("model") or {}
        if model.get("type") != "BPE":
            return (f"a `{model.get('type')}` tokenizer (qrc writes BPE tokenizers; SentencePiece ones are not "
                    "supported yet)")
        if pre_tokenizer(tokenizer) is None:
            return ("its pre-tokenizer is none llama.cpp names (llama.cpp splits text before BPE with one of its own "
                    "known patterns: GPT-2's, Llama 3's, Qwen2's, GPT-4o's)")
        ids = token_ids(tokenizer)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return f"tokenizer.json is not a tokenizer qrc can read ({type(exc).__name__}: {exc})"
    problem = _object_problem(folder / "tokenizer_config.json")  # the gguf package's SpecialVocab reads it
    if problem:  # (and tokenizer.json, and config.json, which the index read) as it writes the special tokens
        return problem
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        return (f"tokenizer.json has token ids up to {max(ids)}, beyond the embedding's {vocab_size} rows "
                "(llama.cpp's token table is the embedding's rows: is this the tokenizer the model was trained with?)")
    return None


SIDE_FILE_LIMIT = 64 << 20  # bytes of a tokenizer_config.json read at check (a chat template is a few KB)
TOKENIZER_LIMIT = 256 << 20  # bytes of a tokenizer.json read at check (a 256k-token vocabulary's is 33 MB)


def _object_problem(path: Path) -> str | None:
    """Why the JSON file at `path` (where there is one) is not a JSON object, or None. Read through read_input: a
    FIFO there is refused, not waited on forever."""
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        value = read_json(path, SIDE_FILE_LIMIT)
    except (OSError, ValueError) as exc:  # UnsafePath is an OSError
        return f"{path.name} cannot be read ({exc})"
    return None if isinstance(value, dict) else f"{path.name} is not a JSON object"
