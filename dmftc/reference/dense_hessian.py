"""The deep action's Hessian as one dense matrix and its LU inverse: the oracle of the causal route.

The runtime never forms the whole Hessian of a deep action: it assembles the dual-primal block U and the
dual-dual block Kd (:func:`dmftc.runtime.solvers.causal_solve.assemble_blocks`) and solves causally
(:func:`dmftc.runtime.solvers.linalg.sandwich`), for the Monte Carlo and the exact (linear) ln Z_l alike.  Here the
same local Hessians are assembled densely (:func:`assemble_hessian`), the closed-form Gaussian action of a
linear network is differentiated as one function (:func:`action_hessian`, 'dense') or layer by layer
('blocked'), and the propagator and the O(1/N) mean correction come from the LU of the whole 2n x 2n matrix
(:func:`propagator_from_hessian`), so that tests compare two independent assemblies and solves.
"""
from __future__ import annotations

import time as _time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg as sla

from dmftc.runtime.problem.deep_action import Layout, Propagator, Saddle, gather_local, bilinear_pairs, observable_map
from dmftc.runtime.problem.standard_spec import as_model

__all__ = ["assemble_hessian", "action_hessian", "propagator_from_hessian", "dense_linear_propagator"]


def assemble_hessian(x0, lay: Layout, model, local_hessians) -> np.ndarray:
    """The action's Hessian at x0: the bilinear part plus, for l = 1..L, ``local_hessians[l - 1]``, the Hessian of
    ln Z_l over its local variables in :func:`gather_local` order (boundary entries dropped)."""
    x0 = jnp.asarray(x0)
    H = np.zeros((lay.n, lay.n))
    ia, ib, val = bilinear_pairs(lay)
    H[ia, ib] += val
    H[ib, ia] += val
    for l in range(1, lay.L + 1):
        _, idx = gather_local(x0, lay, l, model.phi0, model.g_top)
        h = np.asarray(local_hessians[l - 1], dtype=float)
        if h.shape != (len(idx), len(idx)):
            raise ValueError(f"local Hessian of layer {l}: shape {h.shape}, expected {(len(idx),) * 2}")
        keep = idx >= 0
        H[np.ix_(idx[keep], idx[keep])] += h[np.ix_(keep, keep)]
    return H


def propagator_from_hessian(sad: Saddle, H, x0=None) -> Propagator:
    """Sigma = [-(H)^-1]_{phys,phys} and the time-diagonal observables (Delta, K, Phi[l](t,t), G[l](t,t)),
    for the action Hessian H at the saddle ``sad`` (K is mapped linearly with the saddle's kernel diagonals).
    A float64 H is factorised in place (overwritten) to halve the peak memory.  With the saddle-point vector
    ``x0``, also the O(1/N) mean correction from the whole inverse (:mod:`dmftc.runtime.engines.deep_linear_correction`)."""
    L, T = sad.L, sad.T
    lay = Layout(L, T)
    t2 = _time.perf_counter()
    cols = lay.n if x0 is not None else lay.n_phys
    rhs = np.zeros((lay.n, cols))
    rhs[np.arange(cols), np.arange(cols)] = 1.0
    lu = sla.lu_factor(np.asarray(H, dtype=float), overwrite_a=True, check_finite=False)   # H is consumed
    del H
    X = sla.lu_solve(lu, rhs, check_finite=False)
    del lu, rhs
    m1, t_m1 = None, 0.0
    blk = X[: lay.n_phys, : lay.n_phys]
    asym = float(np.abs(blk - blk.T).max() / np.abs(blk).max())
    if x0 is not None:
        from dmftc.runtime.engines.deep_linear_correction import mean_correction_from_inverse

        X *= -1.0
        X += X.T
        X *= 0.5                                                 # C = -H^-1, symmetrised in place
        t_m1 = _time.perf_counter()
        m1 = mean_correction_from_inverse(x0, X, L=L, T=T, model=sad.model)[: lay.n_phys]
        t_m1 = _time.perf_counter() - t_m1
        Sp = X[: lay.n_phys, : lay.n_phys].copy()
    else:
        Sp = -X[: lay.n_phys]
    del X
    t3 = _time.perf_counter() - t_m1
    Sp = 0.5 * (Sp + Sp.T)
    names, rows, J = observable_map(sad, lay)
    So = J @ Sp @ J.T
    sigma = {a: {b: So[np.ix_(rows[a], rows[b])] for b in names} for a in names}
    ev = sla.eigh(Sp, eigvals_only=True, driver="evr")   # (the default drivers crawl on this spectrum)
    diag = {"n_vars": lay.n, "n_phys": lay.n_phys, "asymmetry": asym,
            "min_eig": float(ev.min()), "max_eig": float(ev.max()),
            "psd": bool(ev.min() >= -1e-8 * max(ev.max(), 1e-300)),
            "time_solve": t3 - t2}
    if m1 is not None:
        diag["time_mean_correction"] = t_m1
    return Propagator(sad, lay, sigma, Sp, diag, m1)


def action_hessian(x0, *, L, T, model=None, gamma=None, y=None, eta=None, method="blocked"):
    """Hessian of the closed-form Gaussian action of ``model`` (default: the standard network with gamma, y,
    eta) at x0.  'dense': jax.hessian of the whole action; 'blocked': the runtime's jax.hessian of each ln Z_l
    over its local variables, assembled densely with the bilinear part."""
    from dmftc.runtime.engines.deep_linear import local_hessian, deep_linear_action

    model = as_model(model, gamma, y, eta, L=L)
    lay = Layout(L, T)
    x0 = jnp.asarray(x0)
    if method == "dense":
        fn = jax.jit(jax.hessian(lambda x: deep_linear_action(x, L=L, T=T, model=model)))
        return np.asarray(fn(x0))
    if method != "blocked":
        raise ValueError(f"unknown method {method!r}")
    hess = local_hessian(T, model)
    return assemble_hessian(x0, lay, model, [hess(gather_local(x0, lay, l, model.phi0, model.g_top)[0], float(l == L))
                                             for l in range(1, L + 1)])


def dense_linear_propagator(*, L, T, model=None, gamma=None, y=None, eta=None, method="blocked",
                            correction=False) -> Propagator:
    """The deep linear propagator (and with ``correction`` the O(1/N) mean correction) from the dense LU of the
    whole Hessian of the closed-form action at the exact saddle: the oracle of
    :func:`dmftc.runtime.engines.deep_linear.deep_linear_propagator`."""
    from dmftc.runtime.problem.deep_action import saddle_point_vector
    from dmftc.runtime.engines.deep_linear import deep_linear_saddle

    model = as_model(model, gamma, y, eta, L=L)
    sad = deep_linear_saddle(L=L, T=T, model=model)
    x0 = saddle_point_vector(sad)
    H = action_hessian(x0, L=L, T=T, model=sad.model, method=method)
    return propagator_from_hessian(sad, H, x0=x0 if correction else None)
