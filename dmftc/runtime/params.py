"""Validation of the arguments of ``solve``: names, types, shapes and values."""
from __future__ import annotations

import difflib
import math
import numbers

import numpy as np

from dmftc.errors import ParameterError


def _suggest(name, names):
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _size_params(mod) -> set[str]:
    sizes = set(mod.AXIS_SIZE.values())
    for _, dims, _ in mod.PARAMS:
        sizes |= set(dims)
    return sizes


def _as_number(name, value):
    if isinstance(value, bool) or isinstance(value, (str, bytes)):
        raise ParameterError(f"parameter '{name}' must be a number, got {type(value).__name__} {value!r}")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ParameterError(f"parameter '{name}' must be numeric, got {type(value).__name__}") from None
    if not np.all(np.isfinite(arr)):
        raise ParameterError(f"parameter '{name}' contains NaN or infinity")
    return arr


def resolve_params(mod, given: dict, *, samples: int, seed: int, dirac_width: float = 0.1):
    """Merge ``given`` with the spec's defaults and validate; returns (params, sizes, T)."""
    steps, step = mod.TIME["steps"], mod.TIME["step"]
    declared = {n: dims for n, dims, _ in mod.PARAMS}
    declared[steps], declared[step] = (), ()
    for name in given:
        if name not in declared:
            raise ParameterError(f"unknown parameter '{name}' for model {mod.MODEL}{_suggest(name, declared)}"
                                 f" (parameters: {', '.join(declared)})")
    if not isinstance(samples, numbers.Integral) or isinstance(samples, bool) or samples < 2:
        raise ParameterError(f"samples must be an integer >= 2, got {samples!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ParameterError(f"seed must be an integer, got {seed!r}")
    p = {k: _as_number(k, v) for k, v in given.items()}
    # infer sizes from array shapes when they are not given
    for name, dims in declared.items():
        if name in p and dims:
            arr = p[name]
            if arr.ndim == len(dims):
                for d, n in zip(dims, arr.shape):
                    if d not in p and d not in given:
                        p[d] = np.asarray(float(n))
    sizes = _size_params(mod) | {steps}
    for name in sizes:
        if name in p:
            v = p[name]
            if v.ndim != 0 or v != int(v) or v <= 0:
                raise ParameterError(f"parameter '{name}' must be a positive integer, got {given.get(name, v)!r}")
    p = mod.defaults({k: (float(v) if np.ndim(v) == 0 else v) for k, v in p.items()})
    for name in sizes:
        p[name] = int(p[name])
    T = p[steps]
    if float(p[step]) <= 0:
        raise ParameterError(f"parameter '{step}' (time step) must be positive, got {p[step]!r}")
    sz = {name: int(p[name]) for name in sorted(_size_params(mod))}
    for name, dims in declared.items():
        v = np.asarray(p[name], dtype=float)
        if not np.all(np.isfinite(v)):
            raise ParameterError(f"parameter '{name}' contains NaN or infinity")
        if dims:
            want = tuple(sz[d] for d in dims)
            if v.ndim == 0:
                v = np.full(want, float(v))
            if v.shape != want:
                raise ParameterError(f"parameter '{name}' must have shape {want} "
                                     f"({', '.join(dims)}), got {v.shape}")
            p[name] = v
        elif v.ndim != 0:
            raise ParameterError(f"parameter '{name}' is a scalar, got an array of shape {v.shape}")
    covs = mod.source_covariances(p, sz)
    for group, c in zip(mod.SOURCES, covs):
        c = np.asarray(c, dtype=float)
        names = ", ".join(n for n, _ in group)
        if c.ndim != 2 or c.shape[0] != c.shape[1]:
            raise ParameterError(f"covariance of source(s) {names} is not a square matrix (shape {c.shape})")
        if not np.allclose(c, c.T, atol=1e-12 * max(1.0, np.abs(c).max())):
            raise ParameterError(f"covariance of source(s) {names} is not symmetric: check the parameters in it")
        w = np.linalg.eigvalsh(c)
        if w.min() < -1e-10 * max(1.0, abs(w).max()):
            raise ParameterError(f"covariance of source(s) {names} is not positive semi-definite "
                                 f"(smallest eigenvalue {w.min():.3g}): check the parameters in it")
    if not math.isfinite(float(p[step])):
        raise ParameterError(f"parameter '{step}' must be finite")
    width = _as_number("dirac_width", dirac_width)
    if width.ndim != 0 or width < 0:
        raise ParameterError(f"dirac_width must be a number >= 0, got {dirac_width!r}")
    p["dirac width"] = float(width)
    return p, sz, T
