"""The options of a solve, one definition for every kind of spec (issue 12: one runtime).

``CompiledModel.solve`` validates them here once, whatever the spec, and :func:`dmftc.runtime.solve.solve`
hands each engine (two-layer, deep, deep on several points) the options it reads.  What is checked here holds
for every engine: types and ranges of the numbers, the backend and sampler names, and that an option which only
one kind of spec reads is not given to another (instead of being ignored without a word).  What depends on an
engine (a deep Monte Carlo solve needs at least 2 groups of at least 2 paths for its error bars; a two-layer
solve caps the groups at samples / 2) stays with that engine.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

from dmftc.errors import ParameterError
from dmftc.runtime.numerics.devices import check_devices
from dmftc.runtime.numerics.sampling import SAMPLERS

__all__ = ["SolveOptions", "check_dirac_width", "check_integer", "check_number", "BACKENDS", "DEEP_ONLY",
           "TWO_LAYER_ONLY"]

BACKENDS = ("auto", "exact", "mc", "cubature")
# options that one kind of engine reads and the other has no use for; given for the other kind they are an error
DEEP_ONLY = {
    "propagator_samples": "two-layer specs compute the propagator from the same paths as the means (samples)",
    "propagator_groups": "two-layer specs compute the propagator in the same groups as the means (groups)",
    "propagator_feature_samples": "two-layer specs compute the propagator from the same paths as the means (samples)",
    "memory_limit": "two-layer specs size their batches themselves (batch)",
}
TWO_LAYER_ONLY = {
    "batch": "deep specs march every path of a group at once (lower samples or raise groups to save memory)",
    "devices": "the deep engine marches each group of paths on one device (its paths are not sharded yet)",
}


def check_integer(name: str, v, low: int) -> int:
    """``v`` as an int, or the error: an integer (not a bool) of at least ``low``."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < low:
        raise ParameterError(f"{name} must be an integer >= {low}, got {v!r}")
    return int(v)


def check_number(name: str, v, *, low=None, strict=False) -> float:
    """``v`` as a float: a finite real number, at least ``low`` (above it when ``strict``)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise ParameterError(f"{name} must be a finite real number, got {v!r}")
    if low is not None and (float(v) <= low if strict else float(v) < low):
        raise ParameterError(f"{name} must be {'>' if strict else '>='} {low}, got {v!r}")
    return float(v)


def check_dirac_width(w) -> float:
    """``dirac_width`` as a float, or the error (also for :meth:`CompiledModel.saddle_on_draws`)."""
    if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(float(w)) or w < 0:
        raise ParameterError(f"dirac_width must be a finite number >= 0, got {w!r}")
    return float(w)


def _flag(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise ParameterError(f"{name} must be True or False, got {v!r}")
    return v


@dataclass(frozen=True)
class SolveOptions:
    """How to solve (not what: the model's parameters are separate).

    ``samples`` single-site paths in ``groups`` independent groups, seeded by ``seed`` (for the means; a
    two-layer spec's propagator too); ``dirac_width``: the width of the Gaussians that stand for delta functions
    of a kinked activation's derivatives; ``backend``: 'auto', 'exact' (Gaussian moments, linear processes only),
    'mc', or 'cubature' (two-layer specs: Gauss-Hermite nodes over the sources, at most ``samples`` of them,
    :mod:`dmftc.runtime.engines.cubature`); ``sampler``: the paths' standard normals, 'sobol' or 'random' (None: the engine's default);
    ``progress``: a progress bar on stderr; ``correction``: also the O(1/N) mean correction.  Two-layer specs
    only: ``batch`` (paths per kernel call) and ``devices`` (None: one device; 'all' or a number: each sample
    group's paths sharded over that many JAX devices, :mod:`dmftc.runtime.numerics.devices`).  Deep specs only:
    ``propagator_samples`` and ``propagator_groups`` (paths and groups of the Monte Carlo propagator),
    ``propagator_feature_samples`` (paths whose features give the propagator's feature covariance, at least
    ``propagator_samples``; :func:`dmftc.runtime.engines.deep_propagator.deep_propagator`) and ``memory_limit``
    (bytes a dense propagator may take).
    None means "the engine's default" for the options of one kind."""

    samples: int = 20000
    seed: int = 0
    groups: int = 8
    dirac_width: float = 0.1
    backend: str = "auto"
    sampler: str | None = None
    progress: bool = False
    correction: bool = False
    batch: int | None = None
    propagator_samples: int | None = None
    propagator_groups: int | None = None
    propagator_feature_samples: int | None = None
    memory_limit: float | None = None
    devices: int | str | None = None

    def __post_init__(self):
        check_integer("samples", self.samples, 2)
        check_integer("seed", self.seed, 0)
        check_integer("groups", self.groups, 1)
        check_dirac_width(self.dirac_width)
        if self.backend not in BACKENDS:
            raise ParameterError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {self.backend!r}")
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise ParameterError(f"sampler must be one of {', '.join(map(repr, SAMPLERS))}, got {self.sampler!r}")
        _flag("progress", self.progress)
        _flag("correction", self.correction)
        if self.batch is not None:
            check_integer("batch", self.batch, 1)
        if self.propagator_samples is not None:
            check_integer("propagator_samples", self.propagator_samples, 2)
        if self.propagator_groups is not None:
            check_integer("propagator_groups", self.propagator_groups, 1)
        if self.propagator_feature_samples is not None:
            check_integer("propagator_feature_samples", self.propagator_feature_samples, 2)
        check_devices(self.devices)
        m = self.memory_limit
        if m is not None and (isinstance(m, bool) or not isinstance(m, numbers.Real) or not math.isfinite(float(m))
                              or m <= 0):
            raise ParameterError(f"memory_limit must be a positive number of bytes, got {m!r}")

    def given(self) -> dict:
        """The options that differ from their defaults (for messages and records)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def for_kind(self, kind: str) -> dict:
        """The keyword options of the engine of ``kind`` ('deep' or 'two-layer'), after checking that no option
        of the other kind was given; options left at None take the engine's default."""
        other = TWO_LAYER_ONLY if kind == "deep" else DEEP_ONLY
        if kind == "deep" and self.backend == "cubature":
            raise ParameterError(
                "the cubature backend integrates over sources that are constant in time (two-layer specs); a deep "
                "spec's sources are Gaussian processes whose covariances are order parameters: use backend "
                "'auto' or 'mc'")
        for name, why in other.items():
            if getattr(self, name) is not None:
                which = "two-layer" if kind == "deep" else "deep"
                raise ParameterError(f"the option {name} applies to {which} specs only: {why}")
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in other:
            del out[name]
        return {k: v for k, v in out.items() if v is not None}
