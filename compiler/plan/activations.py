"""Activation memory of one forward pass, by liveness over the graph: a value is resident from the
node that produces it to its last consumer; observed tensors (the augmented graph's outputs) stay to
the end; the model's own outputs (logits, KV cache) and the nodes that only feed
them are removed from the calibration graph, as the calibration graph needs (docs/recipe-language.md, `calibrate`: `passthrough`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from compiler.models.graph import GraphSummary, Node

PASSTHROUGH_DEFAULT: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ActivationPeak:
    """The activation peak of a set of nodes, and the largest tensor in it."""
    bytes: int
    largest: str  # the largest value resident at the peak
    largest_bytes: int
    # the largest value the nodes make and free (not kept): what onnxruntime's memory pattern adds from a session's
    # second run on (`repeated`)
    largest_intermediate: int = 0

    @property
    def repeated(self) -> int:
        """The peak of a session's second and later runs: onnxruntime lays out every intermediate value of a run
        in one block planned from the first run's allocations (its memory pattern, on by default: a chunk of the
        real SmolLM2's calibration then ran in 10 s instead of 13.5), and the block's holes cost about one largest
        intermediate beyond the walk (its [8, 9, 512, 512] scores, 72 MiB: +74 MiB from the second of four
        chunks; a tiny Llama's 33.5 MiB scores: +35)."""
        return self.bytes + self.largest_intermediate


def needed_nodes(graph: GraphSummary, kept: set[str]) -> list[Node]:
    """The nodes that contribute to `kept`, in execution order (everything else is pruned)."""
    producers = graph.producers()
    wanted, stack = set(), list(kept)
    while stack:
        name = stack.pop()
        node = producers.get(name)
        if node is None or node.name in wanted:
            continue
        wanted.add(node.name)
        stack.extend(node.inputs)
    return [n for n in graph.nodes if n.name in wanted]


def peak(graph: GraphSummary, nodes: list[Node], kept: set[str], batch: int, seqlen: int,
         past: int = 0) -> ActivationPeak:
    """Peak resident activation bytes while running `nodes` with `kept` values held to the end, for `batch`
    samples of `seqlen` new tokens after `past` cached ones."""
    size = {}
    known = graph.value_bytes(graph.sizes(batch, seqlen, past), seqlen)
    for node in nodes:
        for name in (*node.inputs, *node.outputs):
            size[name] = known.get(name, 0)
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.inputs:
            last_use[name] = i
    produced = {o for n in nodes for o in n.outputs}
    # Values that come from outside these nodes (graph inputs, or a block's input in a segment) are
    # resident from the start; weights have no entry in `graph.values` and count zero here.
    live = {name: size[name] for node in nodes for name in node.inputs if name not in produced and size.get(name)}
    best = ActivationPeak(sum(live.values()), "", 0)
    for i, node in enumerate(nodes):
        for out in node.outputs:
            live[out] = size.get(out, 0)
        total = sum(live.values()) + _scratch(node, size)
        if total > best.bytes:
            name = max(live, key=lambda n: live[n])
            best = ActivationPeak(total, name, live[name])
        for name in node.inputs:
            if last_use.get(name) == i and name not in kept:
                live.pop(name, None)
    intermediate = max((size.get(o, 0) for o in produced if o not in kept), default=0)
    best = replace(best, largest_intermediate=intermediate)
    # the kept values are returned to Python without a copy (onnxruntime 1.32's numpy arrays share the run's
    # buffers: a run returning 128 MiB of outputs raised the peak by 128 MiB): they count once, live to the end.
    # Counted twice, MiniLM's calibration (W8A8 of every Linear input) planned 169 MiB for 16 samples, 60 measured
    return best


# Ops whose onnxruntime CPU kernel allocates scratch beside its output while it runs, as multiples of the output:
# Where selects from X and from Y into one tensor each, of the broadcast shape, before merging them into its
# output (onnxruntime's where_op.cc). torch.onnx's explicit attention ends in a Where over the softmax's
# [batch, heads, seq, seq]: the real SmolLM2's calibration ran 0.3 GiB past a walk without it.
SCRATCH_OUTPUTS = {"Where": 2}


def _scratch(node: Node, size: dict[str, int]) -> int:
    """Bytes `node`'s kernel holds beside its inputs and outputs while it runs (the output's shape bounds each
    of Where's selections: they are as large where the condition is, as in attention's NaN mask)."""
    times = SCRATCH_OUTPUTS.get(node.op, 0)
    return times * sum(size.get(o, 0) for o in node.outputs) if times else 0


def calibration_peak(graph: GraphSummary, observed: tuple[str, ...], batch: int, seqlen: int, past: int = 0) -> ActivationPeak:
    """The peak of a calibration run that outputs `observed` (the graph pruned to what they need)."""
    kept = set(observed)
    return peak(graph, needed_nodes(graph, kept), kept, batch, seqlen, past)


def folded_bytes(graph: GraphSummary) -> int:
    """Bytes of the values onnxruntime computes once, when a session of the whole graph starts (constant
    folding): the outputs of nodes that read only weights or such values, kept where a node reading
    activations reads them. A tied head's Transpose of the embedding is one (24 MiB for a vocabulary of
    8,192 × 768 in each session, which the weights alone never showed). Quantize and dequantize nodes are
    not folded: onnxruntime keeps them for its integer kernels."""
    produced = {o for n in graph.nodes for o in n.outputs}
    inputs = set(graph.inputs)
    constant: set[str] = set()
    for node in graph.nodes:
        if node.op in ("DequantizeLinear", "QuantizeLinear"):
            continue
        if all(i in constant or (i not in produced and i not in inputs) for i in node.inputs if i):
            constant.update(node.outputs)
    read_live = {i for n in graph.nodes if not set(n.outputs) <= constant for i in n.inputs}
    sizes = graph.value_bytes(graph.sizes(1, 1), 1)
    return sum(sizes.get(name, 0) for name in constant & read_live)


def segment_runs(node_names: list[str]) -> list[tuple[str, list[int]]]:
    """Offload's cut of a graph: runs of nodes in file order, one per block; a node outside every block
    joins the block of the next node that has one, or the last block. (block, node indices) per run."""
    from compiler.models.names import block_of, from_node_name

    blocks = [block_of(from_node_name(name) or "") for name in node_names]
    following = None
    for i in range(len(blocks) - 1, -1, -1):
        following = blocks[i] or following
        blocks[i] = following
    last = next((b for b in reversed(blocks) if b), "(graph)")
    runs: list[tuple[str, list[int]]] = []
    for i, block in enumerate(blocks):
        block = block or last
        if not runs or runs[-1][0] != block:
            runs.append((block, []))
        runs[-1][1].append(i)
    return runs


def segment_outputs(graph: GraphSummary, runs, index: int, wanted: set[str]) -> list[str]:
    """What a segment must produce: values later segments read, and the wanted ones it makes."""
    later = {i for _, idx in runs[index + 1:] for n in idx for i in graph.nodes[n].inputs}
    produced = [o for n in runs[index][1] for o in graph.nodes[n].outputs if o]  # '': an absent optional output
    return list(dict.fromkeys(o for o in produced if o in later or o in wanted))


def propagate(graph: GraphSummary, tensors: tuple[str, ...], passthrough: tuple[str, ...]) -> dict[str, str]:
    """tensor → the tensor whose range it inherits: walk up through passthrough producers (first input)
    to the nearest tensor that is not a passthrough output (selective propagation: docs/recipe-language.md, `calibrate`)."""
    producers = graph.producers()
    out = {}
    for tensor in tensors:
        source = tensor
        while source in producers and producers[source].op in passthrough and producers[source].inputs:
            source = producers[source].inputs[0]
        out[tensor] = source
    return out
