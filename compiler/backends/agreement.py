"""Quality of the emitted model against the float one, on held-out samples, streamed chunk by chunk.

Besides comparing the two outputs, each side's own next-token loss is summed when the output is a language
model's logits and the samples' token ids are known: the perplexity of the float model and of the emitted one
on the same windows (each held-out sample is one window; with `rows pack` they are consecutive windows of the
text), and the `perplexity` metric, the emitted model's relative increase in percent."""

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
    nll_reference: float = 0.0  # -Σ log p(next token) under each model, over `predicted` positions
    nll_candidate: float = 0.0
    predicted: int = 0

    def merge(self, other: Agreement) -> None:
        """Add another's sums (another rank's chunks: backends/ranks.merged adds them in rank order)."""
        for f in fields(Agreement):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def update(self, reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None = None,
               ids: np.ndarray | None = None) -> None:
        """Add a chunk, one sample at a time in float32 (sums in float64): logits of a large vocabulary
        would otherwise multiply into several full-chunk temporaries. `mask` (the attention mask) makes
        the pooled embedding of each sample cover its real tokens only; `ids` (the token ids) give each
        model's next-token loss where the outputs are logits over the vocabulary."""
        for i, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
            ref, cand = np.asarray(ref, np.float32), np.asarray(cand, np.float32)
            sample_mask = None if mask is None else np.asarray(mask[i])
            self._add_sample(ref, cand, None if ids is None else next_tokens(ref, np.asarray(ids[i]), sample_mask))
            self.embedding_sum += _embedding_cosine(ref, cand, sample_mask)

    def _add_sample(self, ref: np.ndarray, cand: np.ndarray, targets: np.ndarray | None = None) -> None:
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
            if targets is not None:
                self._add_loss(p, q, targets[start:start + ROWS_PER_STEP])
        self.signal += norm_r
        self.cos_sum += dot / max(np.sqrt(norm_r) * np.sqrt(norm_c), 1e-30)
        self.samples += 1

    def _add_loss(self, p: np.ndarray, q: np.ndarray, targets: np.ndarray) -> None:
        """Each model's negative log-likelihood of the next tokens (`targets`, -1 where none is predicted)."""
        rows = np.nonzero(targets >= 0)[0]
        chosen = targets[rows]
        self.nll_reference -= float(p[rows, chosen].sum(dtype=np.float64))
        self.nll_candidate -= float(q[rows, chosen].sum(dtype=np.float64))
        self.predicted += int(rows.size)

    def perplexities(self) -> tuple[float, float] | None:
        """(float model's, emitted model's) perplexity on the held-out windows; None when not measured."""
        if not self.predicted:
            return None
        return float(np.exp(self.nll_reference / self.predicted)), float(np.exp(self.nll_candidate / self.predicted))

    def value(self, metric: VerifyMetric) -> float:
        """The figure of `metric` over the samples so far."""
        if metric is VerifyMetric.PERPLEXITY:
            if not self.predicted:
                return float("nan")  # not a language model's logits, or no token ids: fails any bound
            return 100.0 * float(np.expm1((self.nll_candidate - self.nll_reference) / self.predicted))
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
        """Every metric's figure (the compile summary and `.verify.json` show them all); perplexity only where
        it was measured, with both models' perplexities beside its relative increase."""
        out = {m.value: float(self.value(m)) for m in VerifyMetric if m is not VerifyMetric.PERPLEXITY}
        both = self.perplexities()
        if both is not None:
            out |= {VerifyMetric.PERPLEXITY.value: self.value(VerifyMetric.PERPLEXITY),
                    "float_perplexity": both[0], "emitted_perplexity": both[1]}
        return out


def next_tokens(logits: np.ndarray, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray | None:
    """Per position of one sample, the id of the token after it (what its logits predict), -1 where there is
    none: the last position, and positions whose next token is padding. None when `logits` are not over a
    vocabulary these ids index ([positions, vocab] with every id below vocab): an encoder's hidden states."""
    ids = ids.reshape(-1)
    if logits.ndim != 2 or logits.shape[0] != ids.shape[0] or ids.size < 2 or ids.min() < 0 or \
            ids.max() >= logits.shape[1]:
        return None
    targets = np.full(ids.shape[0], -1, np.int64)
    targets[:-1] = ids[1:]
    mask = None if mask is None else mask.reshape(-1)
    if mask is not None and mask.size >= ids.size:  # a decoder's mask covers its cache first, then the new tokens
        targets[:-1][mask[mask.size - ids.size + 1:] == 0] = -1
    return targets


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
