"""The canonical text form of a RecipeIR: a normalised recipe with every default written out.

It parses back to the same IR (tests check the round trip), so `qrc check --dump-ir` shows exactly
what the compiler will do in the language the user already reads. Comments note where a value came
from; nothing in it depends on the machine, the time or absolute paths.
"""

from __future__ import annotations

import hashlib
import json

from compiler.ir.types import (
    ActivationQuant,
    AutoGroup,
    DataKind,
    Granularity,
    RecipeIR,
    Rounding,
    Rule,
    Scheme,
    Selector,
    SelectorKind,
    Transform,
    TransformKind,
    WeightQuant,
)
from compiler.ir.values import format_bytes, format_number


def quote(text: str) -> str:
    """A recipe string literal for `text`."""
    return json.dumps(text, ensure_ascii=False)


def _regex_literal(pattern: str) -> str:
    return 're"' + pattern.replace('"', '\\"') + '"'


def _granularity(granularity: Granularity, group_size: int | None, block: tuple[int, int] | None = None) -> str:
    if granularity is Granularity.GROUP:
        return f"group {group_size}"
    if granularity is Granularity.BLOCK and block is not None:
        return f"block {block[0]}x{block[1]}"
    return granularity.value


def _weights(w: WeightQuant) -> str:
    gran = _granularity(w.granularity, w.group_size, w.block)
    return f"weights {w.qtype.name} {gran} {'symmetric' if w.symmetric else 'asymmetric'}"


def _activations(a: ActivationQuant | None) -> str:
    if a is None:
        return "activations none"
    sym = "symmetric" if a.symmetric else "asymmetric"
    return f"activations {a.qtype.name} {_granularity(a.granularity, a.group_size)} {sym} {a.mode.value}"


def scheme_parts(s: Scheme) -> tuple[str, str, str]:
    """A scheme's weights, activations and rounding, as the recipe language writes them."""
    static = s.rounding is Rounding.GPTQ and s.static_groups and not s.act_order
    minmax = s.rounding is Rounding.GPTQ and not s.mse_scales
    order = (" act_order" if s.act_order else " no_act_order") if s.rounding is Rounding.GPTQ else ""
    options = order + (" static_groups" if static else "") + \
        (" minmax_scales" if minmax else "")
    if s.learned is not None:
        options += f" {{ iters {s.learned.iters}  lr {format_number(s.learned.rate)}  batch {s.learned.batch} }}"
    return _weights(s.quantized_weights), _activations(s.activations), f"rounding {s.rounding.name}{options}"


def _scheme(s: Scheme) -> list[str]:
    body = list(scheme_parts(s))
    if s.span is None:  # a preset named directly by a rule: shown, not redefined
        return [f"    # preset {s.name}: " + "; ".join(body)]
    base = f" = {s.base}" if s.base else ""
    return [f"    scheme {s.name}{base} {{", *(f"        {line}" for line in body), "    }"]


def _selector(sel: Selector) -> str:
    if sel.kind is SelectorKind.GLOB:
        return quote(sel.pattern)
    if sel.kind is SelectorKind.REGEX:
        return _regex_literal(sel.pattern)
    return f"type {sel.pattern}"


def recipe_hash(canonical_ir: str) -> str:
    """The sha256 of a recipe's canonical form: what the emitted model and the report record."""
    return hashlib.sha256(canonical_ir.encode()).hexdigest()


def rule_text(rule: Rule) -> str:
    """A quantize rule as the recipe writes it: `"model.layers.*" -> w4`."""
    return f"{', '.join(_selector(s) for s in rule.selectors)} -> {rule.scheme}"


def _data(ir: RecipeIR) -> str:
    d = ir.calibration.data
    opts = [f"samples {d.samples}"]
    if d.kind in (DataKind.SYNTHETIC, DataKind.TEXT, DataKind.DATASET):
        opts.append(f"seqlen {d.seqlen}")
    if d.kind is DataKind.SYNTHETIC or d.rows is not None and d.rows.shuffle:
        opts.append(f"seed {d.seed}")
    if d.tokenizer is not None:
        opts.append(f"tokenizer {quote(d.tokenizer)}")
    if d.rows is not None:
        r = d.rows
        opts += [f"image {quote(r.image)}"] if r.image else []
        opts += [f"{'messages' if r.messages else 'text'} {quote(r.field)}", f"split {quote(r.split)}",
                 f"shuffle {'on' if r.shuffle else 'off'}", f"rows {r.policy.value}"]
    path = f" {quote(d.path)}" if d.path is not None else ""
    return f"data {d.kind.value}{path} {{ {'  '.join(opts)} }}"


def _calibrate(ir: RecipeIR) -> list[str]:
    c = ir.calibration
    return ["    calibrate {", f"        {_data(ir)}", f"        chunk {c.chunk}", f"        {c.method.text()}",
            f"        passthrough [{', '.join(c.passthrough)}]", f"        workers {c.workers}",
            f"        bins {c.bins}", f"        experts {c.experts.value}",
            f"        attention {c.attention.value}", "    }"]


def _memory(ir: RecipeIR) -> list[str]:
    m = ir.memory
    lines = ["    memory {", f"        mode {m.mode.value}"]
    lines.append(f"        ram {format_bytes(m.ram)}" if m.ram is not None else "        # ram: detected at plan time")
    if m.vram:
        count = f"{len(m.vram)} x " if len(m.vram) > 1 else ""
        lines.append(f"        vram {count}{format_bytes(m.vram[0])}")
    if m.disk is not None:
        lines.append(f"        disk {quote(m.disk)}")
    if m.ranks > 1:  # one rank is the default, and every recipe before ranks existed
        lines.append(f"        ranks {m.ranks}")
    return lines + ["    }"]


def _optional_blocks(ir: RecipeIR) -> list[str]:
    lines = []
    if ir.mixed_precision:
        mp = ir.mixed_precision
        lines += ["    mixed_precision {", f"        choices [{', '.join(mp.choices)}]",
                  f"        metric {mp.metric.value}", f"        budget {format_number(mp.budget_bits)} bits",
                  f"        samples {mp.samples}", "    }"]
    if ir.verify:
        v = ir.verify
        lines += ["    verify {", f"        samples {v.samples}", f"        metric {v.metric.value}",
                  f"        {v.bound.value} {format_number(v.threshold)}", "    }"]
    if ir.transform:
        lines += _transform(ir.transform)
    if ir.kv_cache:
        lines.append(f"    kv_cache {{ {_activations(ir.kv_cache.quant).removeprefix('activations ')} }}")
    if ir.emit:
        target = ir.emit.target
        where = "" if target is None else f"  runtime {target.runtime.value}" + (
            f"  device {target.device.value}" if target.device else "")
        lines.append(f"    emit {quote(ir.emit.path)} {{ format {ir.emit.format.name}{where} }}")
    return lines


def _transform(t: Transform) -> list[str]:
    fixed_alpha = t.kind is TransformKind.SMOOTHQUANT and not t.alpha_search  # its `grid` means nothing
    values = {"alpha": "search" if t.alpha_search else format_number(t.alpha),
              "grid": "" if fixed_alpha else str(t.grid), "duo_scaling": "on" if t.duo_scaling else "off",
              "online": " ".join(r.value for r in t.online), "block": str(t.block) if t.block else ""}
    if t.learning is not None:
        values.update(iters=str(t.learning.iters), lr=format_number(t.learning.lr), batch=str(t.learning.batch),
                      init=t.learning.start.value)
    settings = [f"{key} {values[key]}" for key in t.kind.settings if values[key]]
    maps = [f"map {_selector(m.source)} -> {', '.join(_selector(x) for x in m.targets)}" for m in t.mappings]
    inferred = [] if maps or t.kind.rotates else ["# mappings inferred from the model's block shape"]
    return [f"    transform {t.kind.name} {{"] + [f"        {x}" for x in settings + inferred + maps] + ["    }"]


def print_ir(ir: RecipeIR) -> str:
    """Canonical text of the IR (ends with a newline)."""
    backend_note = "  # from the model" if ir.backend_from_model else ""
    lines = [f"recipe {ir.name} {{", f"    model {quote(ir.model)}", f"    backend {ir.backend.value}{backend_note}"]
    for scheme in ir.schemes:
        lines += _scheme(scheme)
    lines.append("    quantize {  # the last matching rule wins")
    for rule in ir.rules:
        lines.append(f"        {rule_text(rule)}  # rule {rule.index}, line {rule.span.line}")
    lines.append("    }")
    for group in ir.groups:
        auto = "auto" if group.auto is AutoGroup.ALL else f"auto {group.auto.value}"
        target = quote(group.pattern) if group.pattern is not None else auto
        lines.append(f"    group {target} policy {group.policy.value}")
    lines += _calibrate(ir) + _memory(ir) + _optional_blocks(ir)
    return "\n".join(lines) + "\n}\n"
