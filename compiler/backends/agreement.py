"""Quality of the emitted model against the float one, on held-out samples, streamed chunk by chunk."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from compiler.ir.types import Bound, VerifyMetric
from compiler.plan.memory import AGREEMENT_ROWS

ROWS_PER_STEP = AGREEMENT_ROWS  # positions compared at once (the plan counts their scratch)


@dataclass
class Agreement:
    """Running sums over chunks of the primary output (the model's first output)."""

    cos_sum: float = 0.0
    samples: int = 0
    signal: float = 0.0
    noise: float = 0.0
    top1_same: int = 0
    top1_total: int = 0
    kld_sum: float = 0.0
    positions: int = 0
    embedding_sum: float = 0.0
    nonfinite: int = field(default=0)

    def merge(self, other: Agreement) -> None:
        """Add another's sums (another rank's chunks: backends/ranks.merged adds them in rank order)."""
        for f in fields(Agreement):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def update(self, reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Add a chunk, one sample at a time in float32 (sums in float64): logits of a large vocabulary
        would otherwise multiply into several full-chunk temporaries. `mask` (the attention mask) makes
        the pooled embedding of each sample cover its real tokens only."""
        for i, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
            ref, cand = np.asarray(ref, np.float32), np.asarray(cand, np.float32)
            self._add_sample(ref, cand)
            self.embedding_sum += _embedding_cosine(ref, cand, None if mask is None else mask[i])

    def _add_sample(self, ref: np.ndarray, cand: np.ndarray) -> None:
        """One sample, ROWS_PER_STEP positions at a time: a long sample's logits over a large vocabulary
        would otherwise take several sample-sized temporaries (seven for the KL's log-softmaxes)."""
        rows_r, rows_c = ref.reshape(-1, ref.shape[-1]) if ref.ndim else ref.reshape(1, 1), \
            cand.reshape(-1, cand.shape[-1]) if cand.ndim else cand.reshape(1, 1)
        dot = norm_r = norm_c = 0.0
        for start in range(0, rows_r.shape[0], ROWS_PER_STEP):
            r, c = rows_r[start:start + ROWS_PER_STEP], rows_c[start:start + ROWS_PER_STEP]
            finite = np.isfinite(r) & np.isfinite(c)
            self.nonfinite += int(c.size - np.isfinite(c).sum())
            if not finite.all():
                r, c = np.where(finite, r, 0.0).astype(np.float32), np.where(finite, c, 0.0).astype(np.float32)
            del finite
            dot += float(np.dot(r.ravel(), c.ravel()))
            norm_r += float(np.dot(r.ravel(), r.ravel()))
            norm_c += float(np.dot(c.ravel(), c.ravel()))
            diff = r - c
            self.noise += float(np.dot(diff.ravel(), diff.ravel()))
            del diff
            self.top1_same += int(np.sum(r.argmax(-1) == c.argmax(-1)))
            self.top1_total += r.shape[0]
            p, q = _log_softmax(r), _log_softmax(c)
            self.kld_sum += float(np.sum(np.exp(p) * (p - q), dtype=np.float64))
            self.positions += r.shape[0]
        self.signal += norm_r
        self.cos_sum += dot / max(np.sqrt(norm_r) * np.sqrt(norm_c), 1e-30)
        self.samples += 1

    def value(self, metric: VerifyMetric) -> float:
        """The figure of `metric` over the samples so far."""
        if metric is VerifyMetric.COSINE:
            return self.cos_sum / max(self.samples, 1)
        if metric is VerifyMetric.SQNR:
            return 10 * np.log10(self.signal / self.noise) if self.noise > 0 else float("inf")
        if metric is VerifyMetric.TOP1:
            return self.top1_same / max(self.top1_total, 1)
        if metric is VerifyMetric.EMBEDDING_COSINE:
            return self.embedding_sum / max(self.samples, 1)
        return self.kld_sum / max(self.positions, 1)

    def figures(self) -> dict[str, float]:
        """Every metric's figure (the compile summary and `.verify.json` show them all)."""
        return {m.value: float(self.value(m)) for m in VerifyMetric}


def _embedding_cosine(ref: np.ndarray, cand: np.ndarray, mask: np.ndarray | None) -> float:
    """Cosine of the mean-pooled embeddings ([tokens, hidden] → [hidden]) over the real tokens."""
    if ref.ndim < 2:
        ref_e, cand_e = ref, cand
    else:
        weights = np.ones(ref.shape[0], np.float32) if mask is None else mask.reshape(-1)[: ref.shape[0]].astype(np.float32)
        ref_e = (ref * weights[:, None]).sum(0) / max(weights.sum(), 1)
        cand_e = (cand * weights[:, None]).sum(0) / max(weights.sum(), 1)
    norms = float(np.linalg.norm(ref_e)) * float(np.linalg.norm(cand_e))
    return float(np.dot(ref_e, cand_e)) / max(norms, 1e-30)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def passes(value: float, bound: Bound, threshold: float) -> bool:
    """Whether `value` meets the recipe's bound."""
    return value >= threshold if bound is Bound.AT_LEAST else value <= threshold
