"""The columns of dF/dq in the driving order parameters of a two-layer program, from one batch of paths: by
per-path transfer matrices (:mod:`dmftc.runtime.sensitivities.site_transfer`) where the program allows them, else by the tangent
march (:mod:`dmftc.runtime.sensitivities.site_tangents`); the batches of paths and causal segments they run in."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.march.site_layout import Flat, canonical
from dmftc.runtime.numerics.march_numerics import array_module
from dmftc.runtime.sensitivities.site_tangents import driver_jacobian
from dmftc.runtime.sensitivities.site_transfer import SEGMENT, transfer_applies
from dmftc.runtime.sensitivities.site_transfer import driver_jacobian as transfer_jacobian

__all__ = ["driver_columns", "equal_batches", "pad_rows", "path_batch", "tangent_method", "tangent_segments"]


def driver_columns(mod, sz, T, width, shapes, segments, method):
    """dF/dq in the driving order parameters' columns from one batch of paths: (T m, those columns), by
    per-path transfer matrices (``method`` 'transfer': dmftc.runtime.sensitivities.site_transfer) or the tangent march
    ('march': dmftc.runtime.sensitivities.site_tangents); either cut into ``segments`` causal pieces."""
    F = Flat(mod, shapes, T)
    drive = F.drivers()
    idx = np.flatnonzero(drive)
    basis = np.zeros((T * F.m, idx.size))
    basis[idx, np.arange(idx.size)] = 1.0
    basis = basis.reshape(T, F.m, idx.size)
    c = idx.size // T

    def run(normals, wts, pj, q, avg, explicit):
        blocks = [(n, a, b) for n, a, b in zip(F.names, F.edges[:-1], F.edges[1:]) if n in mod.SITE["drivers"]]
        if method == "transfer":         # the drivers' one-hot at one step: the same at every step (time-major)
            local = {n: F.layout_rows(n, jnp.asarray(basis[:1, a:b, :c]))[0] for n, a, b in blocks}
            rows = transfer_jacobian(mod, T, wts, pj, q, local, normals=normals, sizes=dict(sz), width=width,
                                     avg=avg, explicit=explicit, segment=-(-T // segments))
        else:
            columns = {n: F.layout_rows(n, jnp.asarray(basis[:, a:b])) for n, a, b in blocks}
            rows = driver_jacobian(mod, T, wts, pj, q, columns, normals=normals, sizes=dict(sz), width=width,
                                   avg=avg, explicit=explicit, per_step=c, segments=segments)
        per = [jax.vmap(lambda r, n=n: canonical(mod, n, r))(rows[n]) for n in F.names]     # (T, comps, D)
        return jnp.concatenate(per, axis=1).reshape(T * F.m, idx.size)
    return run, idx


def tangent_method(mod, method: str | None = None) -> str:
    """How the drivers' columns of dF/dq are computed: ``method`` ('transfer' or 'march'), or by default per-path
    transfer matrices where the program allows them (:func:`dmftc.runtime.sensitivities.site_transfer.transfer_applies`)."""
    if method is None:
        return "transfer" if transfer_applies(mod) else "march"
    if method not in ("transfer", "march"):
        raise ParameterError(f"tangents: 'transfer' or 'march', not {method!r}")
    if method == "transfer" and not transfer_applies(mod):
        raise ParameterError(f"{mod.MODEL}: its program keeps more than sample-scope running sums, so its tangents "
                             "have no transfer-matrix form; use tangents='march'")
    return method


def pad_rows(x, n: int):
    """x with its leading axis (paths) zero-padded to n rows: a JAX array stays one, anything else becomes a
    numpy array (padded on the host: no program compiled per shape; the jitted callee takes it as it is)."""
    xp = array_module(x)
    x = xp.asarray(x)
    return x if x.shape[0] == n else xp.concatenate([x, xp.zeros((n - x.shape[0],) + x.shape[1:], x.dtype)])


def equal_batches(S: int, B: int) -> tuple[int, list]:
    """S paths in batches of at most B, made equal (the last one padded with zero-weight rows, so that one
    compilation serves them all): (the common size, [(first row, real rows)])."""
    B = -(-S // -(-S // B))
    return B, [(a, min(B, S - a)) for a in range(0, S, B)]


_BUDGET = 2.5e6           # floats held by one batch's tangents (20 MB): a batch's tangents near the CPU's caches
# (two_layer, T = 250, 12500 paths: one batch 20 s, batches of 1250 13 s; 1250 paths: one batch 0.81 s, batches
# of 250 0.65 s)


def _components(mod, sz, name) -> int:
    """Components of one path's value of ``name`` (the product of its sample indices' sizes)."""
    axes = dict(mod.SITE["axes"])
    return int(np.prod([sz[axes[i]] for i in dict(mod.SITE["stored"]).get(name, ())] or [1]))


def _tangent_size(mod, sz, T: int) -> tuple[int, int]:
    """(the fields' and running sums' components per path, the driving directions)."""
    comps = lambda name: _components(mod, sz, name)                                         # noqa: E731
    per_path = sum(comps(f) for f in mod.SITE["fields"]) + sum(comps(n) for n, _ in mod.SITE.get("sums", ()))
    return per_path, T * sum(comps(n) for n, _ in mod.ORDERS if n in mod.SITE["drivers"])


def path_batch(mod, sz, T: int, S: int, batch: int | None = None, tangents: str | None = None) -> int:
    """Paths per batch of the drivers' columns: ``batch``, or as many as keep a batch's arrays within
    :data:`_BUDGET` floats: the tangent march carries each path's fields' components times the directions, a few
    times over in its intermediates; the transfer matrices (:mod:`dmftc.runtime.sensitivities.site_transfer`) carry each path's
    running sums times the directions, and one segment's factors (two_layer, T = 250: 1250 paths per batch
    instead of 357, and a group in one call: 0.43 s -> 0.27 s for 8 groups)."""
    if batch is not None:
        return max(1, min(int(batch), S))
    per_path, directions = _tangent_size(mod, sz, T)
    if tangent_method(mod, tangents) == "transfer":
        k, n_avg = _transfer_size(mod, sz)
        c = directions // T
        floats = k * directions + 2 * SEGMENT * (n_avg * k + k * c + k * k)
    else:
        floats = 4 * per_path * directions
    return int(max(1, min(S, _BUDGET // max(1, floats))))


def _transfer_size(mod, sz) -> tuple[int, int]:
    """(the running sums' components per path, the averages' components)."""
    return (sum(_components(mod, sz, n) for n, _ in mod.SITE.get("sums", ())),
            sum(_components(mod, sz, q) * len(syms) for q, syms in mod.SITE["readouts"]))


_SEGMENT_WORK = 5.0e7     # tangent updates per batch above which the march is cut into causal segments


def tangent_segments(mod, sz, T: int, B: int) -> int:
    """Pieces of the tangent march (site_tangents.driver_jacobian): 4 when a batch of B paths updates more than
    :data:`_SEGMENT_WORK` tangent components over the march (then it costs about 10/16 of carrying every
    direction throughout: measured on two_layer_multi, P = 4, T = 100, 1000 paths, 2.7 s -> 1.7 s; two_layer,
    T = 250, 1250 paths in batches of 357, 0.97 s -> 0.50 s), else 1 (each piece is one more compiled loop: on
    two_layer, T = 60, 1000 paths, 4 pieces compiled 1.1 s longer and ran 0.01 s faster)."""
    per_path, directions = _tangent_size(mod, sz, T)
    return 4 if B * T * directions * per_path > _SEGMENT_WORK else 1
