"""Where each tensor of an ONNX decoder sits for a rotation (onnx/rotation.py), found from the model's index and
graph summary alone (`qrc check` asks it; no weight bytes): the layers reading each norm's output (they take the
norm's weights and Q), the layers writing the residual stream (Qᵀ), each head's values (R2), the embedding, the LM
head (tied: a MatMul of the embedding's transpose) and the down projections' inputs (R4, online). Any other reader
of a rotated value, or a bias where the rotation would turn it, is a problem said in words: the rotation would
change the model's outputs there."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.models.index import LayerKind, ModelIndex
from compiler.resolve.rotation import final_norms, role
from compiler.resolve.rotation_widths import widths

READS_ATTENTION, READS_MLP = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.qkv_proj"), ("mlp.gate_proj", "mlp.up_proj")
DOWN = "mlp.down_proj"  # what R4 turns the input of
WRITES = ("attn.o_proj", DOWN)
_LINEAR_OPS = ("MatMul", "Gemm")


@dataclass(frozen=True)
class Fold:
    """The initializers a rotation changes, by role (weight names as the graph has them)."""

    readers: tuple[tuple[str, str], ...]  # (a layer reading a norm's output, that norm's weight)
    values: tuple[tuple[str, int], ...]  # (v_proj's or a fused qkv_proj's weight, its value outputs: the last
    # ones), each head's output columns by H (R2)
    writers: tuple[str, ...]  # o_proj and down_proj weights: Qᵀ on their outputs
    heads_in: tuple[str, ...]  # o_proj weights: each head's input rows by H (R2)
    downs: tuple[str, ...]  # down_proj weights: · D (R4)
    down_inputs: tuple[str, ...]  # the values the down projections read (R4 turns them online)
    norms: tuple[str, ...]  # every folded norm's weight (they become ones)
    embedding: str  # the embedding's weight, [vocab, hidden] (or the head's, see `gather`)
    head: str | None  # the LM head's weight (None: tied, it reads the embedding's transpose)
    head_node: str  # the head's MatMul
    final_norm: str  # the final norm's weight
    gather: str | None = None  # an embedding Gather reading Transpose(head): `embedding` is then the head's weight
    biases: tuple[tuple[str, int], ...] = ()  # (a bias added after v, qkv, o or down: its values, the last ones of
    # which each head's turn by H (R2); -1: a writer's, turned by Q)


@dataclass(frozen=True)
class Downs:
    """The down projections R4 alone turns (`transform smoothquant { online r4 }`): their weights (· D) and the
    values they read (turned online)."""

    weights: tuple[str, ...]
    inputs: tuple[str, ...]


def downs_of(index: ModelIndex) -> Downs | str:
    """The down projections of an ONNX decoder, each reading a value a node of the graph makes (R4 is inserted
    after that node), or why there are none."""
    graph = index.graph
    if graph is None:
        return "the model has no graph"
    made = {o for node in graph.nodes for o in node.outputs}
    downs = [x for x in index.layers if x.kind is LayerKind.LINEAR and x.block and role(x.name, x.block) == DOWN]
    if not downs:
        return "it has no `mlp.down_proj`"
    unmade = next((x for x in downs if x.input not in made), None)
    if unmade is not None:
        return f"`{unmade.name}` reads `{unmade.input}`, which no node of the graph makes"
    return Downs(tuple(x.weight for x in downs), tuple(x.input for x in downs))


def fold_of(index: ModelIndex) -> Fold | str:
    """The fold of an ONNX decoder, or why it cannot be rotated."""
    graph = index.graph
    if graph is None:
        return "the model has no graph"
    norms_by_output = {n.output: n for n in index.norms}
    produced = {o for node in graph.nodes for o in node.outputs} | set(graph.inputs)
    consumers: dict[str, list] = {}
    for node in graph.nodes:
        for name in node.inputs:
            consumers.setdefault(name, []).append(node)
    embeddings = [x for x in index.layers if x.kind is LayerKind.EMBEDDING]
    finals = final_norms(index)
    if len(embeddings) > 1 or len(finals) != 1:
        return "it has no single embedding and final norm"
    problem = _heads_problem(index)
    if problem:
        return problem
    readers, values, writers, heads_in, downs, down_inputs = [], [], [], [], [], []
    biases: list[tuple[str, int]] = []
    for x in index.layers:
        if x.kind is not LayerKind.LINEAR or not x.block:
            continue
        leaf = role(x.name, x.block)
        if leaf in READS_ATTENTION + READS_MLP:
            norm = norms_by_output.get(x.input)
            wanted = "input_layernorm" if leaf in READS_ATTENTION else "post_attention_layernorm"
            if norm is None or not norm.name.endswith(wanted):
                return f"`{x.name}` does not read `{wanted}`'s output"
            readers.append((x.weight, norm.weight))
            if leaf == "attn.v_proj":
                values.append((x.weight, x.out_features))
            elif leaf == "attn.qkv_proj":  # q, k and v one after another: v is the last kv_heads · head_dim
                kv_heads, head_width = index.config_value("num_key_value_heads"), widths(index)[1]
                if not kv_heads or not head_width:
                    return f"`{x.name}` fuses q, k and v, and the model's config does not give their widths"
                values.append((x.weight, int(kv_heads) * head_width))
        elif leaf in WRITES:
            writers.append(x.weight)
            if leaf == "attn.o_proj":
                heads_in.append(x.weight)
            else:
                downs.append(x.weight)
                down_inputs.append(x.input)
        if leaf in ("attn.v_proj", "attn.qkv_proj", *WRITES):
            bias = _bias(x.weight, graph.nodes, consumers, produced)
            if bias == _GEMM_BIAS:
                return f"`{x.name}` is a Gemm with a bias, which the ONNX backend does not rotate yet"
            if bias is not None:  # v's (or qkv's) bias turns as its values do, a writer's as the stream
                biases.append((bias, values[-1][1] if leaf in READS_ATTENTION else -1))
    for norm in index.norms:
        others = [n for n in consumers.get(norm.output, []) if n.op not in _LINEAR_OPS]
        if others:
            return f"`{norm.name}`'s output is read by a {others[0].op} node, which a rotation would change"
    final = finals[0]
    heads = [n for n in consumers.get(final.output, []) if n.op in _LINEAR_OPS]
    if len(heads) != 1:
        return "its final norm is read by no single LM head"
    head_node, head_weight = heads[0], heads[0].inputs[1] if len(heads[0].inputs) > 1 else ""
    head = next((x.weight for x in index.layers if x.weight == head_weight), None)
    made = {o: n for n in graph.nodes for o in n.outputs}
    if embeddings:
        embedding, gather = embeddings[0].weight, None
        if head is None:  # tied: the head reads Transpose(embedding)
            source = made.get(head_weight)
            if source is None or source.op != "Transpose" or source.inputs[0] != embedding:
                return "its LM head reads neither a weight of its own nor the embedding's transpose"
    else:  # tied the other way (onnxruntime-genai's builder): the embedding gathers from Transpose(head)
        gathers = [n for n in graph.nodes if n.op == "Gather" and n.inputs[0] in made
                   and made[n.inputs[0]].op == "Transpose" and made[n.inputs[0]].inputs[0] == head]
        if head is None or len(gathers) != 1:
            return "it has no embedding a rotation can find"
        embedding, gather = head, gathers[0].name
    return Fold(tuple(readers), tuple(values), tuple(writers), tuple(heads_in), tuple(downs), tuple(down_inputs),
                tuple(n.weight for n in index.norms), embedding, head, head_node.name, final.weight, gather,
                tuple(biases))


def _heads_problem(index: ModelIndex) -> str:
    """R2 turns each head's values alike, which is only the same model where its blocks are the heads: the head
    width the config gives (or a built-in's) must tile v and o as the graph has them (a config.json left beside a
    graph by another model would not). '' when it does, or when no head width is known (R2 is then left out)."""
    head = widths(index)[1]
    if not head:
        return ""
    kv = index.config_value("num_key_value_heads") or index.config_value("num_attention_heads")
    for x in index.layers:
        leaf = role(x.name, x.block)
        if leaf == "attn.v_proj" and (x.out_features % head or (kv and x.out_features != int(kv) * head)):
            return f"`{x.name}` writes {x.out_features} values, not heads of {head} (the config beside the graph)"
        if leaf == "attn.o_proj" and x.in_features % head:
            return f"`{x.name}` reads {x.in_features} values, not heads of {head} (the config beside the graph)"
    return ""


_GEMM_BIAS = "\0gemm"  # `_bias`'s answer for a Gemm's own bias input


def _bias(weight: str, nodes, consumers: dict, produced: set[str]) -> str | None:
    """The constant (an initializer no node makes) the MatMul of `weight` adds to its output, if any; _GEMM_BIAS for
    a Gemm with a bias of its own."""
    for node in nodes:
        if weight not in node.inputs:
            continue
        if node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2]:
            return _GEMM_BIAS
        for after in consumers.get(node.outputs[0], []):
            constants = [i for i in after.inputs if i not in produced]
            if after.op == "Add" and len(constants) == 1:
                return constants[0]
    return None
