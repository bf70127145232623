"""The model parameters of a solve, one resolver for every kind of spec: names, types, shapes, sizes and values."""
from __future__ import annotations

import difflib

import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.problem.options import check_dirac_width


def _suggest(name, names):
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _size_params(mod) -> set[str]:
    """The integer sizes of a spec: the steps, the depth of a deep spec, and every name a parameter's shape or an
    index axis is counted in (P of Kx[P, P])."""
    sizes = set(getattr(mod, "AXIS_SIZE", {}).values()) | {mod.TIME["steps"]}
    if getattr(mod, "DEPTH", None):
        sizes.add(mod.DEPTH)
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


def resolve_params(mod, given: dict, *, dirac_width: float | None = None):
    """The spec's defaults overridden by ``given``, validated, for every kind of spec: returns (params, sizes, T).

    Sizes come out as ints, other scalars as floats, parameters with a shape (``Kx[P, P]``) as arrays of that shape (a scalar given
    for one is broadcast); ``sizes`` maps every size parameter (steps, depth, axis sizes) to its int.  A size
    not given is read from the shapes of the arrays given (they must agree).  ``dirac_width``: recorded as
    ``params['dirac width']`` (two-layer generated kernels read it).  The solve's options are checked by
    :class:`dmftc.runtime.problem.options.SolveOptions`."""
    steps, step = mod.TIME["steps"], mod.TIME["step"]
    declared = {n: tuple(dims) for n, dims, _ in mod.PARAMS}
    declared[steps], declared[step] = (), ()
    for name in given:
        if name not in declared:
            raise ParameterError(f"unknown parameter '{name}' for model {mod.MODEL}{_suggest(name, declared)}"
                                 f" (parameters: {', '.join(declared)})")
    p = {k: _as_number(k, v) for k, v in given.items()}
    seen: dict = {}                              # a size not given, from the shapes of the arrays given
    for name in given:                           # in the order given, for the message below
        dims = declared[name]
        if dims and p[name].ndim == len(dims):
            for d, n in zip(dims, p[name].shape):
                seen.setdefault(d, {})[name] = n
    for d, by in seen.items():
        if d in given:
            continue
        if len(set(by.values())) > 1:
            raise ParameterError(f"the arrays given disagree on the size {d}: "
                                 + ", ".join(f"'{k}' has {n}" for k, n in by.items()))
        p[d] = np.asarray(float(next(iter(by.values()))))
    sizes = _size_params(mod)
    what = {steps: "the number of steps", getattr(mod, "DEPTH", None): "the number of hidden layers"}
    for name in sorted(sizes):
        if name in p:
            v = p[name]
            if v.ndim != 0 or v != int(v) or v <= 0:
                why = f" ({what[name]})" if name in what else ""
                raise ParameterError(f"parameter '{name}' must be a positive integer{why}, got {given.get(name, v)!r}")
    p = mod.defaults({k: (float(v) if np.ndim(v) == 0 else v) for k, v in p.items()})
    sz = {name: int(p[name]) for name in sorted(sizes)}
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
        else:
            p[name] = sz[name] if name in sz else float(v)
    if p[step] <= 0:
        raise ParameterError(f"parameter '{step}' (time step) must be positive, got {p[step]!r}")
    if hasattr(mod, "source_covariances"):        # a two-layer spec: its sources' covariance matrices
        _check_source_covariances(mod, p, sz)
    if getattr(mod, "POINTS", None):              # a deep spec on several points: Gram matrices, update mask
        _check_point_params(mod, p)
    if dirac_width is not None:
        p["dirac width"] = check_dirac_width(dirac_width)
    return p, sz, sz[steps]


def _check_source_covariances(mod, p: dict, sz: dict) -> None:
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


def _check_point_params(mod, p: dict) -> None:
    """A deep spec's parameters with two point indices are Gram matrices of the points (symmetric, PSD); its update
    mask is 0 or 1 per point."""
    pts = mod.POINTS
    for k, n in pts["params"]:
        arr = p[k]
        if n == 2:
            if not np.allclose(arr, arr.T, rtol=0, atol=1e-12 * max(1.0, np.abs(arr).max())):
                raise ParameterError(f"parameter '{k}' must be symmetric")
            lam = np.linalg.eigvalsh(0.5 * (arr + arr.T))
            if lam.min() < -1e-10 * max(1.0, np.abs(lam).max()):
                raise ParameterError(f"parameter '{k}' must be positive semi-definite (a Gram matrix of the points; "
                                     f"smallest eigenvalue {lam.min():.3g})")
        if k == pts.get("mask") and not np.all((arr == 0) | (arr == 1)):
            raise ParameterError(f"parameter '{k}' is the update mask: 1 on a point the network trains on, 0 on a test "
                                 f"point, got {arr.tolist()} (a weighted loss puts its weights in the error signal)")


def resolve_deep_params(mod, given: dict) -> tuple[dict, int, int]:
    """The spec's defaults overridden by ``given``, validated (:func:`resolve_params`):
    (params, L, T)."""
    p, sz, T = resolve_params(mod, given)
    return p, sz[mod.DEPTH], T
