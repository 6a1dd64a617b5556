"""The mixed-precision search at compile time, shared by both backends: score every unit under every
choice (a backend's Scorer supplies weights, input Gram matrices and the kld scores), cache the scores on
disk by content hash, choose under the budget, and resolve the recipe again with the choices, before
the groups (docs/recipe-language.md, `mixed_precision`).

Scores are losses, lower is better, one per unit and choice:
- snr: Σ over members of ‖W − Q(W)‖² / ‖W‖² (no data);
- mse: Σ over members of ‖X(W − Q(W))ᵀ‖² / ‖XWᵀ‖² on the calibration samples, from XᵀX;
- kld: the KL divergence of the model's output from float, measured or estimated by the backend.

Under torchrun (backends/ranks.py) the torch scorer runs its rank's share of the scoring chunks and merges the
Gram matrices and gradients in rank order; the per-unit losses are computed unit i on rank i mod N and handed
to all, so every rank chooses the same assignment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from compiler.backends.ranks import Ranks, all_gathered
from compiler.ir.kinds import RoundingData
from compiler.ir.types import Rounding, Scheme, SensitivityMetric
from compiler.models.exports import files_hash
from compiler.models.index import Layer, ModelIndex
from compiler.plan.ops import AssignPrecision, ScoreSensitivity
from compiler.quant.weights import Convention, quantize_weight
from compiler.resolve import mixed
from compiler.resolve.assignment import Assignment
from compiler.safe_files import read_json, replace_file

CACHE_VERSION = "qrc-sensitivity-v1"


class Scorer(Protocol):
    """What a backend supplies to the search (see each method)."""
    index: ModelIndex

    def rounded(self, w: np.ndarray, scheme: Scheme) -> np.ndarray:
        """The weight ([out, in] float32) as the scheme rounds it on this backend, back in float."""

    def digest(self) -> str:
        """A content hash of the model's files."""

    def weight(self, layer: Layer) -> np.ndarray:
        """The float weight as [out, in] float32."""

    def grams(self, layers: Sequence[Layer], progress) -> dict[str, np.ndarray]:
        """Layer name → Σ xᵀx of its input over the scoring samples ([in, in], float64)."""

    def kld(self, units: Sequence[mixed.Unit], schemes: Sequence[Scheme], progress) -> dict[str, list[float]]:
        """Unit → its KL score under each scheme."""


@dataclass(frozen=True, slots=True)
class UnitResult:
    """One searched unit: its members, size, loss under each choice, and what was chosen."""
    unit: str
    members: tuple[str, ...]
    params: int
    losses: tuple[float, ...]  # per choice
    chosen: str
    bits: float  # storage bits per weight under the chosen scheme


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What the mixed-precision search did: the choice per unit, the bits reached, the greedy curve."""
    metric: SensitivityMetric
    choices: tuple[str, ...]
    budget_bits: float
    average_bits: float
    from_cache: bool
    cache_file: str
    units: tuple[UnitResult, ...]
    predicted_loss: float  # Σ of the chosen choices' losses
    curve: tuple[tuple[float, float], ...]  # (average bits, predicted loss) along the greedy path, no budget

    def layers_by_choice(self) -> dict[str, list[str]]:
        """Each choice that some unit got → the layers that got it."""
        out = {c: [m for u in self.units if u.chosen == c for m in u.members] for c in self.choices}
        return {c: layers for c, layers in out.items() if layers}


def fake_quantize(w: np.ndarray, scheme: Scheme, convention: Convention) -> np.ndarray:
    """The weight as an integer scheme rounds it, back in float ([out, in]). GPTQ is scored as rtn: the search
    ranks layers, and rtn's error bounds what GPTQ leaves; a data-free method (mse, a plug-in's) as itself. (The
    floating formats are the torch backend's.)"""
    rounding = scheme.rounding if scheme.rounding.data is RoundingData.NONE else Rounding.RTN
    return quantize_weight(w, scheme.quantized_weights, rounding, 0, 1, convention).dequantize()


def scoring_batches(op: ScoreSensitivity, index: ModelIndex):
    """The op's first `samples` calibration samples, in calibration chunks."""
    from compiler import data

    batches = data.calibration_batches(op.data, index, op.chunk)
    return dataclasses.replace(batches, samples=min(batches.samples, op.samples))


def _relative_losses(units, schemes, scorer: Scorer, layer_loss, advance) -> dict[str, list[float]]:
    """Σ over each unit's members of `layer_loss(name, w, Q(w))` under each scheme (float32 arrays)."""
    out = {}
    for unit in units:
        totals = [0.0] * len(schemes)
        for name in unit.members:
            w = scorer.weight(scorer.index.layer(name))
            for k, scheme in enumerate(schemes):
                totals[k] += layer_loss(name, w, scorer.rounded(w, scheme))
        out[unit.name] = totals
        advance()
    return out


def snr_losses(units, schemes, scorer: Scorer, advance) -> dict[str, list[float]]:
    """snr losses: Σ ‖W − Q(W)‖² / ‖W‖² over each unit's members, per scheme."""
    def noise_to_signal(_, w: np.ndarray, rounded: np.ndarray) -> float:
        error = w - rounded
        return float(np.vdot(error, error)) / max(float(np.vdot(w, w)), 1e-30)
    return _relative_losses(units, schemes, scorer, noise_to_signal, advance)


def mse_losses(units, schemes, scorer: Scorer, grams: Mapping[str, np.ndarray], advance) -> dict[str, list[float]]:
    """mse losses: Σ ‖X(W − Q(W))ᵀ‖² / ‖XWᵀ‖² from each member's XᵀX, per scheme."""
    def output_error(name: str, w: np.ndarray, rounded: np.ndarray) -> float:
        w = w.astype(np.float64)
        error, gram = w - rounded, grams[name]
        return float(np.sum((error @ gram) * error)) / max(float(np.sum((w @ gram) * w)), 1e-30)
    return _relative_losses(units, schemes, scorer, output_error, advance)


def _by_unit(ranks: Ranks, units: Sequence[mixed.Unit], losses) -> dict[str, list[float]]:
    """`losses(units)` for every unit, unit i computed on rank i mod N and handed to every rank (the same
    arithmetic as one process: the figures are one process's)."""
    if ranks.world == 1:
        return losses(units)
    merged: dict[str, list[float]] = {}
    for part in all_gathered(ranks, losses([u for i, u in enumerate(units) if ranks.owns(i)])):
        merged.update(part)
    return {u.name: merged[u.name] for u in units}


def cache_key(op: ScoreSensitivity, units: Sequence[mixed.Unit], digest: str, backend: str, ranks: int = 1) -> str:
    """What the scores depend on: the model's content, the scoring settings, data and choices, the units, and
    for data-driven scores the ranks that summed them (float sums in another order); not the budget, so a sweep
    over budgets scores once."""
    identity = {
        "version": CACHE_VERSION, "backend": backend, "model": digest, "metric": op.metric.value,
        "samples": op.samples, "data": _data_identity(op.data) if op.metric is not SensitivityMetric.SNR else "",
        "chunk": op.chunk, "choices": [_scheme_identity(s) for s in op.choices],
        "units": [[u.name, *u.members] for u in units],
    }
    if ranks > 1 and op.metric is not SensitivityMetric.SNR:
        identity["ranks"] = ranks
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _data_identity(data) -> str:
    content = files_hash([Path(data.path)]) if data.path and Path(data.path).is_file() else ""
    return repr((data.kind.value, data.path, content, data.samples, data.seqlen, data.seed, data.tokenizer))


def _scheme_identity(scheme: Scheme) -> str:
    w = scheme.quantized_weights
    return f"{w.qtype.name} {w.granularity.value} {w.group_size} {w.symmetric} {scheme.rounding.name}"


def cache_root(disk: Path | None) -> Path:
    """Where scores are cached: `memory { disk }` or $QRC_CACHE, under sensitivity/."""
    from compiler.models.builtin import cache_dir

    return (disk or cache_dir()) / "sensitivity"


def _load(path: Path, units: Sequence[mixed.Unit], count: int) -> dict[str, list[float]] | None:
    """The cached scores, or None when missing or not what this search needs (then it scores again)."""
    try:
        found = read_json(path, 64 << 20, own=True)
        losses = {u.name: [float(x) for x in found[u.name]] for u in units}
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return losses if all(len(v) == count and np.isfinite(v).all() for v in losses.values()) else None


def _save(path: Path, losses: Mapping[str, Sequence[float]]) -> None:
    """Write the scores atomically; a cache that cannot be written only costs the next compile time."""
    try:
        replace_file(path, json.dumps(losses, indent=1, sort_keys=True))
    except OSError:
        pass


def score(op: ScoreSensitivity, disk: Path | None, units, scorer: Scorer, backend: str,
          progress, ranks: Ranks = Ranks()) -> tuple[dict[str, list[float]], bool, Path]:
    """Each unit's losses, from the cache when this model, data and setting were scored before (under torchrun:
    when every rank finds it, so that all take the same path; the first rank writes it)."""
    schemes = list(op.choices)
    path = cache_root(disk) / f"{cache_key(op, units, scorer.digest(), backend, ranks.world)}.json"
    cached = _load(path, units, len(schemes))
    if ranks.world > 1 and not all(all_gathered(ranks, cached is not None)):
        cached = None
    if cached is not None:
        return cached, True, path
    metric = op.metric
    if metric is SensitivityMetric.KLD:
        losses = scorer.kld(units, schemes, progress)
    else:
        grams = None
        if metric is SensitivityMetric.MSE:
            grams = scorer.grams([scorer.index.layer(n) for u in units for n in u.members], progress)
        advance = progress(f"score {metric.value}", len(range(ranks.rank, len(units), ranks.world)))
        losses = _by_unit(ranks, units, lambda mine: snr_losses(mine, schemes, scorer, advance) if grams is None
                          else mse_losses(mine, schemes, scorer, grams, advance))
    if ranks.first:
        _save(path, losses)
    return losses, False, path


@dataclass(frozen=True, slots=True)
class Scores:
    """What `score_sensitivity` produces: every unit's loss under every choice, and where they came from."""

    units: tuple[mixed.Unit, ...]
    losses: Mapping[str, Sequence[float]]
    from_cache: bool
    cache_file: Path


@dataclass(frozen=True)
class Scored:
    """The `sensitivity` buffer's value: the searched units' losses (None: nothing searched), for the
    assignment they were scored on (assign_precision chooses from it)."""

    assignment: Assignment
    scores: Scores | None


def score_units(op: ScoreSensitivity, disk: Path | None, assignment: Assignment, scorer: Scorer, backend: str,
                progress, ranks: Ranks = Ranks()) -> Scores | None:
    """The plan's `score_sensitivity` op: the searched units' losses (None when nothing is searched); scores
    are cached under `disk` (`memory { disk }`), else $QRC_CACHE. Under torchrun the scorer must share its
    data (the torch scorer does)."""
    units = tuple(mixed.units_for(op.choices, assignment))
    if not units:
        return None
    losses, from_cache, path = score(op, disk, units, scorer, backend, progress, ranks)
    return Scores(units, losses, from_cache, path)


def assign(op: AssignPrecision, assignment: Assignment, scores: Scores | None) -> tuple[Assignment, SearchResult | None]:
    """The plan's `assign_precision` op: the assignment with the searched units' choices applied (groups
    move as one: the op's resolver resolves the recipe again with them), and what was chosen."""
    if scores is None or op.resolve is None:
        return assignment, None
    units, losses, choices = scores.units, scores.losses, op.choices
    chosen = mixed.choose(units, losses, op.budget_bits)
    precision = {name: choices[chosen[u.name]] for u in units for name in u.members}
    searched = op.resolve(assignment.model, precision)
    rows = tuple(UnitResult(u.name, u.members, u.params, tuple(losses[u.name]), choices[chosen[u.name]],
                            u.bits[chosen[u.name]] / u.params) for u in units)
    predicted = sum(losses[u.name][chosen[u.name]] for u in units)
    return searched, SearchResult(op.metric, choices, op.budget_bits,
                                  mixed.average_bits(units, chosen), scores.from_cache, str(scores.cache_file), rows,
                                  predicted, tuple(mixed.frontier(units, losses)))
