"""Resumable calibration: with `disk` set, observer state is saved after every segment (atomically), so a
compile that was killed continues where it stopped and gives the same bytes as one that was not.

The state is data only: an .npz of integer histograms and GPTQ's float64 Hessian sums, and a JSON
description (format version, segments done, each observer's numbers), read with `allow_pickle=False` and
validated. Nothing from the cache folder
is ever executed; a foreign, damaged or other-version file means starting over."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.backends.owners import claim, superseded
from compiler.quant.gptq import HessianObserver
from compiler.quant.observers import HistogramObserver, MinMaxObserver
from compiler.safe_files import open_regular, own_folder, refuse_unless_regular

FORMAT = "qrc-resume-v2"
OWNER_SUFFIX = ".owner.json"  # beside each state: whose it is (remove_superseded)


@dataclass(frozen=True)
class ResumeState:
    """Data-only resume state of an interrupted calibration (observers after the last finished segment)."""

    path: Path

    @staticmethod
    def for_run(disk: Path, *identity: str) -> ResumeState:
        """The state file of the run that `identity` (recipe, model, group) names, under `disk`."""
        key = hashlib.sha256("\x00".join(identity).encode()).hexdigest()[:24]
        return ResumeState(disk / "checkpoints" / f"calibration-{key}.npz")

    def load(self) -> tuple[int, dict] | None:
        """(segments done, observers) from an earlier, interrupted run; None when there is none or it is not
        a valid state of this format (then the run starts over)."""
        try:
            with os.fdopen(open_regular(self.path, os.O_RDONLY, create=False), "rb") as handle, \
                    np.load(handle, allow_pickle=False) as archive:  # never through a link or from a FIFO
                meta = json.loads(str(archive["meta"]))
                if meta.get("format") != FORMAT:
                    return None
                observers = {o["name"]: _observer(o, archive) for o in meta["observers"]}
                done = meta["done"]
        except Exception:  # noqa: BLE001 - whatever a foreign or damaged file raises (a truncated zip, an overflow),
            return None  # it is not trusted: the run starts over (Q408)
        if not isinstance(done, int) or done < 0:
            return None
        return done, observers

    def save(self, done: int, observers: dict) -> None:
        """Write the observers after `done` segments atomically."""
        own_folder(self.path.parent)
        refuse_unless_regular(self.path)
        arrays: dict[str, np.ndarray] = {}
        described = []
        for i, (name, observer) in enumerate(observers.items()):
            described.append({"name": name, **_describe(observer, i, arrays)})
        arrays["meta"] = np.array(json.dumps({"format": FORMAT, "done": done, "observers": described}))
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".resume-", suffix=".npz")
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, allow_pickle=False, **arrays)
        os.replace(tmp, self.path)

    def remove(self) -> None:
        """Delete the state: the calibration it resumes has finished."""
        self.path.unlink(missing_ok=True)
        self._owner().unlink(missing_ok=True)

    def claim(self, mine: dict) -> None:
        """Record whose state this is (backends/owners.py), so that a later run into the same destination with
        another recipe or model removes it (remove_superseded)."""
        claim(self._owner(), mine)

    def _owner(self) -> Path:
        return self.path.with_name(self.path.stem + OWNER_SUFFIX)

    def exists(self) -> bool:
        """Whether a state file is there (valid or not)."""
        return self.path.exists()


def remove_superseded(disk: Path, mine: dict) -> None:
    """The states (and offload's kept block boundaries) that earlier runs into the same destination left, where
    the recipe, model or rank count differs from `mine`: they could never be resumed, and the boundaries can
    be large."""
    for path in (disk / "checkpoints").glob("calibration-*" + OWNER_SUFFIX):
        if superseded(path, mine):
            stem = path.name.removesuffix(OWNER_SUFFIX)
            (path.parent / f"{stem}.npz").unlink(missing_ok=True)
            shutil.rmtree(disk / f"boundary-{stem}", ignore_errors=True)  # segments.BoundaryCache's folder
            path.unlink(missing_ok=True)


def _minmax(o: MinMaxObserver) -> dict:
    return {"min": o.min if math.isfinite(o.min) else None, "max": o.max if math.isfinite(o.max) else None,
            "finite": o.finite, "nonfinite": o.nonfinite}


def _describe(observer, index: int, arrays: dict[str, np.ndarray]) -> dict:
    if isinstance(observer, HessianObserver):
        arrays[f"hessian_{index}"] = observer.sum
        return {"kind": "hessian", "features": observer.features, "rows": observer.rows, "index": index}
    if isinstance(observer, MinMaxObserver):
        return {"kind": "minmax", **_minmax(observer)}
    if observer.counts is not None:
        arrays[f"counts_{index}"] = observer.counts
    return {"kind": "histogram", "bins": observer.bins, "exponent": observer.exponent, "index": index,
            "has_counts": observer.counts is not None, "minmax": _minmax(observer.minmax)}


def _restore_hessian(d: dict, archive) -> HessianObserver:
    o = HessianObserver(int(d["features"]))
    total = archive[f"hessian_{int(d['index'])}"]
    rows = d["rows"]
    if total.dtype != np.float64 or total.shape != o.sum.shape or not isinstance(rows, int) or rows < 0:
        raise ValueError("damaged Hessian")
    o.sum, o.rows = total, rows
    return o


# the largest value a float32 activation can have: a range beyond it did not come from a calibration run
_FLOAT32_MAX = 3.4028234663852886e38
_MAX_BINS = 1 << 24  # a histogram this fine is far beyond any recipe's `bins`


def _restore_minmax(d: dict) -> MinMaxObserver:
    o = MinMaxObserver()
    o.min = math.inf if d["min"] is None else float(d["min"])
    o.max = -math.inf if d["max"] is None else float(d["max"])
    o.finite, o.nonfinite = int(d["finite"]), int(d["nonfinite"])
    for bound in (o.min, o.max):
        if math.isfinite(bound) and abs(bound) > _FLOAT32_MAX or math.isnan(bound):
            raise ValueError("range beyond float32")
    if o.finite < 0 or o.nonfinite < 0:
        raise ValueError("negative counts")
    return o


def _observer(d: dict, archive) -> MinMaxObserver | HistogramObserver | HessianObserver:
    if d["kind"] == "minmax":
        return _restore_minmax(d)
    if d["kind"] == "hessian":
        return _restore_hessian(d, archive)
    if d["kind"] != "histogram":
        raise ValueError(f"unknown observer kind {d['kind']!r}")
    bins, exponent = int(d["bins"]), int(d["exponent"])
    if not 16 <= bins <= _MAX_BINS or not -1074 <= exponent <= 1023:  # math.ldexp(1, exponent) stays finite
        raise ValueError("histogram out of range")
    o = HistogramObserver(bins=bins)
    o.exponent, o.minmax = exponent, _restore_minmax(d["minmax"])
    if d["has_counts"]:
        counts = archive[f"counts_{int(d['index'])}"]
        if counts.dtype != np.int64 or counts.shape != (o.bins,) or (counts < 0).any():
            raise ValueError("damaged histogram")
        o.counts = counts
    return o
