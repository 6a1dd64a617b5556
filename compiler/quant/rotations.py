"""Orthogonal rotations for outlier spreading (QuaRot's random Hadamard): a Hadamard matrix of order n, built as
a Kronecker product of Sylvester's powers of two and Paley's constructions from primes, and its randomized,
normalized form diag(s)·H/√n (s random signs), which is orthogonal. A rotation Q applied to a residual stream and
folded into the weights either side leaves the float model's outputs unchanged (W x = (W Q)(Qᵀ x)) while
spreading an outlier channel over all of them, which is what makes 4-bit activations round well.

The signs come before H: x·diag(s)·H mixes sign-flipped channels, so each seed is another rotation (QuaRot's and
compressed-tensors' random_hadamard_matrix, the Hadamard transform of diag(s), puts them first too). After H
(x·H·diag(s), as qrc had them until 2026-12-05) they only flip the sign of each rotated channel, which a symmetric
format rounds alike: every seed was the same rotation, and which Hadamard construction a width took decided
alone. On the real SmolLM2, NVFP4A16 after R1+R2 (validation text, bench/hadamard_construction.py): with the signs
after H, KL 0.768 for 576 = 8 × 72 and 0.597 to 0.676 for the other constructions of 576, every seed alike; with
them before (R1's and R2's), 0.654 / 0.669 / 0.674 for seeds 0-2 of 8 × 72 (with R1's alone before, 12 × 48's
seeds spread as widely, 0.608-0.715): the construction no longer decides.

numpy only, so that `qrc check` and `qrc plan` can ask `hadamard_order` whether a width can be rotated without
importing torch (once a recipe can name a rotation: docs/torch.md, Rotations)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

# the name of R4 in a compressed-tensors folder's transform_config, as llm-compressor's SpinQuantModifier writes it
# (and its online transform's module under each down projection: `R4_input`)
ONLINE_DOWN = "R4"
SLICE = 4096  # rows (or columns) the torch backend rotates at a time: what its scratch scales with (its cost.py)


def _is_prime(q: int) -> bool:
    return q > 1 and all(q % d for d in range(2, int(q ** 0.5) + 1))


def _jacobsthal(q: int) -> np.ndarray:
    """Q[i, j] = χ(j − i), χ the quadratic character mod the prime q (0, 1 for squares, −1 otherwise)."""
    squares = {(x * x) % q for x in range(1, q)}
    chi = np.array([0] + [1 if r in squares else -1 for r in range(1, q)], dtype=np.int64)
    idx = (np.arange(q)[None, :] - np.arange(q)[:, None]) % q
    return chi[idx]


def _paley_one(q: int) -> np.ndarray:
    """Order q + 1, q a prime ≡ 3 (mod 4): I + S with S = [[0, 1ᵀ], [−1, Q]] skew-symmetric."""
    n = q + 1
    s = np.zeros((n, n), dtype=np.int64)
    s[0, 1:] = 1
    s[1:, 0] = -1
    s[1:, 1:] = _jacobsthal(q)
    return np.eye(n, dtype=np.int64) + s


def _paley_two(q: int) -> np.ndarray:
    """Order 2(q + 1), q a prime ≡ 1 (mod 4): from the symmetric C = [[0, 1ᵀ], [1, Q]], each 0 replaced by
    [[1, −1], [−1, −1]] and each ±1 by ±[[1, 1], [1, −1]]."""
    n = q + 1
    c = np.zeros((n, n), dtype=np.int64)
    c[0, 1:] = 1
    c[1:, 0] = 1
    c[1:, 1:] = _jacobsthal(q)
    zero = np.array([[1, -1], [-1, -1]], dtype=np.int64)
    one = np.array([[1, 1], [1, -1]], dtype=np.int64)
    return np.kron(c, one) + np.kron(np.eye(n, dtype=np.int64), zero)


@cache
def _base_orders() -> dict[int, tuple[str, int]]:
    """The orders a Paley construction gives (up to 256), and which: ('one' | 'two', q)."""
    found: dict[int, tuple[str, int]] = {}
    for q in range(3, 256):
        if not _is_prime(q):
            continue
        if q % 4 == 3 and q + 1 <= 256:
            found.setdefault(q + 1, ("one", q))
        if q % 4 == 1 and 2 * (q + 1) <= 256:
            found.setdefault(2 * (q + 1), ("two", q))
    return found


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def hadamard_order(n: int) -> tuple[int, ...] | None:
    """The factors a Hadamard matrix of order n is built from here (a power of two, then up to two Paley
    orders), or None where none is (n neither 1, 2 nor a multiple of 4, or a factor no Paley prime reaches)."""
    if _power_of_two(n):
        return (n,)
    base = sorted(_base_orders(), reverse=True)
    for m1 in base:
        if n % m1:
            continue
        if _power_of_two(n // m1):
            return (n // m1, m1)
        for m2 in base:
            if (n // m1) % m2 == 0 and _power_of_two(n // m1 // m2):
                return (n // m1 // m2, m1, m2)
    return None


def _sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1), dtype=np.int64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


FACTOR = 64  # the largest Sylvester factor kept whole: H_4096 = H_64 ⊗ H_64


def factor_orders(n: int) -> tuple[int, ...] | None:
    """The orders of `hadamard_factors(n)` without building them (None where no matrix is built)."""
    orders = hadamard_order(n)
    if orders is None:
        return None
    power, sizes = orders[0], []
    while power > 1:
        sizes.append(min(power, FACTOR))
        power //= sizes[-1]
    return tuple(sizes) + orders[1:] or (1,)


def hadamard_factors(n: int) -> list[np.ndarray]:
    """The Kronecker factors of `hadamard(n)`, in order (H = F1 ⊗ F2 ⊗ …): its power of two as Sylvester factors of
    at most FACTOR, then its Paley orders. A product by H is a product by each factor along its axis of the
    reshaped rows: n·ΣFi operations a row instead of n² (4096: 128 instead of 4096)."""
    sizes = factor_orders(n)
    if sizes is None:
        raise ValueError(f"no Hadamard matrix of order {n} is built here (n = 2^k × Paley orders)")
    base = _base_orders()
    factors = []
    for m in sizes:  # Sylvester's H_(ab) = H_a ⊗ H_b for the powers of two; Paley's for the rest
        if _power_of_two(m):
            factors.append(_sylvester(m))
        else:
            kind, q = base[m]
            factors.append(_paley_one(q) if kind == "one" else _paley_two(q))
    return factors


def hadamard(n: int) -> np.ndarray:
    """A Hadamard matrix of order n (entries ±1, H Hᵀ = n I). ValueError where no construction here gives one."""
    h = np.ones((1, 1), dtype=np.int64)
    for factor in hadamard_factors(n):
        h = np.kron(h, factor)
    return h


def random_signs(n: int, seed: int = 0) -> np.ndarray:
    """The ±1 of the randomized Hadamard diag(s)·H/√n, from `seed`."""
    return np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), size=n)


def random_hadamard(n: int, seed: int = 0) -> np.ndarray:
    """The orthogonal diag(s)·H/√n, s random signs from `seed` (float64)."""
    return random_signs(n, seed)[:, None] * hadamard(n).astype(np.float64) / np.sqrt(n)


@dataclass(frozen=True)
class Turn:
    """The randomized Hadamard diag(s)·(F1 ⊗ F2 ⊗ …)/√n of order n held as its factors, in float32 numpy (the ONNX
    backend's rotations: onnx/rotation.py; the torch backend's Kronecker is the same matrix for the same seed)."""

    factors: tuple[np.ndarray, ...]
    signs: np.ndarray  # s/√n

    @classmethod
    def seeded(cls, n: int, seed: int) -> Turn:
        """The randomized Hadamard of order n whose signs come from `seed`."""
        return cls(tuple(f.astype(np.float32) for f in hadamard_factors(n)),
                   (random_signs(n, seed) / np.sqrt(n)).astype(np.float32))

    @property
    def width(self) -> int:
        """n."""
        return self.signs.shape[0]

    def right(self, rows: np.ndarray) -> np.ndarray:
        """rows · diag(s)·F/√n in float32, over the last axis (a multiple of n wide: each run of n turned alike, the
        block-diagonal rotation), each factor applied along its axis of the rows reshaped."""
        lead = rows.shape[:-1]
        y = (rows.reshape(-1, self.width).astype(np.float32) * self.signs).reshape(-1, *(f.shape[0] for f in self.factors))
        for axis, factor in enumerate(self.factors, start=1):
            y = np.moveaxis(np.moveaxis(y, axis, -1) @ factor, -1, axis)
        return y.reshape(*lead, -1)

    def halves(self) -> tuple[np.ndarray, np.ndarray]:
        """F as A ⊗ C, the factors split where a + c is least: x·F for x read as a×c is Aᵀ·x·C, two small products
        (what an online rotation runs in a graph)."""
        best = min(range(len(self.factors) + 1), key=lambda k: _kron(self.factors[:k]).shape[0] +
                   _kron(self.factors[k:]).shape[0])
        return _kron(self.factors[:best]), _kron(self.factors[best:])


def _kron(factors) -> np.ndarray:
    product = np.ones((1, 1), dtype=np.float32)
    for factor in factors:
        product = np.kron(product, factor)
    return product
