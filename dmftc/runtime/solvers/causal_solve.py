"""Propagator of the deep-network action by causal block forward substitution (no dense inverse).

The variables of :class:`~dmftc.runtime.problem.deep_action.Layout` split into PRIMAL and DUAL halves of equal size:

    primal  Phi[l](t,s), G[l](t,s) (t >= s), Delta(t), the causal couplings A[l](t,s) (s < t), B[l](t,s) (s <= t)
    dual    their conjugates Phi_hat, G_hat, Delta_hat and the anti-causal couplings A[l](t,s) (s >= t),
            B[l](t,s) (s > t), which -Tr(A B) pairs with the causal entries of the other family.

At the saddle every ln Z_l is identically zero on the primal subspace (zero hats, causal couplings: the
single-site integrand is 1 path by path), so the primal-primal block of the action Hessian vanishes and

    Hess S = [[0, U^T], [U, Kd]],      [Hess S]^-1 = [[U^-1 (-Kd) U^-T, U^-1], [U^-T, 0]],

so the propagator is Sigma = -[(Hess S)^-1]_{phys} = [U^-1 Kd U^-T]_{phys} (the paper's U^-1 kappa U^-T, with the
response functions carried as extra primal variables instead of a Schur complement).  Give every variable the
time tau at which it first acts: max(t, s) for a two-time entry, t for Delta and Delta_hat.  An average at time
tau depends only on primal variables with time <= tau, so U (dual rows, primal columns), ordered by tau, is
BLOCK LOWER TRIANGULAR with square diagonal blocks (L (2 tau + 2) + 1 + (L - 1)(2 tau + 1) variables at tau).

For R observables given as rows E over the primal variables, E Sigma E^T = Y Kd Y^T with Y = E U^-1 by block
back substitution (the causal solve every propagator uses, :func:`dmftc.runtime.solvers.linalg.sandwich`): O(R n^2)
work for n = dim(U), instead of the O(n^3) dense factorisation of the 2n-dimensional Hessian.  This module
orders the deep action's variables (:func:`causal_order`), assembles U and Kd (:func:`assemble_blocks`) and
maps the result to the observables (:func:`causal_propagator`).
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla

from dmftc.runtime.problem.deep_action import Layout, Propagator, Saddle, gather_local, bilinear_pairs, observable_map
from dmftc.errors import NumericalError, ParameterError
from dmftc.runtime.solvers.linalg import left_solve, sandwich
from dmftc.runtime.solvers.local_hessian import local_block

__all__ = ["CausalOrder", "causal_order", "CausalBlocks", "assemble_blocks", "back_kernel", "causal_propagator",
           "covariance_of_all", "physical_sigma", "SOLVE_KERNELS"]


@dataclass(frozen=True)
class CausalOrder:
    """Primal and dual variables of a Layout, each sorted by time (stable).  ``primal``/``dual``: their flat
    Layout indices in that order; ``edges``: (T + 1) boundaries of the time blocks (the same for both halves);
    ``is_primal``/``pos``: per flat index, its half and its position within that half."""
    primal: np.ndarray
    dual: np.ndarray
    edges: np.ndarray
    is_primal: np.ndarray
    pos: np.ndarray


def causal_order(lay: Layout, points: int = 1) -> CausalOrder:
    """The variables of ``lay`` by time.  ``points``: P of a spec on several training points, whose steps are the
    (time, point) pairs tau = t P + mu (dmftc.frontend.points_deep): a variable's time is then the time of its
    steps, and a coupling is causal when its source's TIME is earlier (A) or not later (B), so the diagonal
    blocks hold every point of one time."""
    T = lay.T
    time = np.arange(T) // points
    tau = np.zeros(lay.n, int)
    prim = np.zeros(lay.n, bool)
    ti, _ = lay.tril
    t_full, s_full = (time[k] for k in np.divmod(np.arange(T * T), T))
    for name, (o, size) in lay.blocks.items():
        sl = slice(o, o + size)
        if name.startswith(("Phi", "G")):
            tau[sl], prim[sl] = time[ti], "_hat" not in name
        elif name.startswith("Delta"):
            tau[sl], prim[sl] = time, name == "Delta"
        else:                                                   # A[l] primal for s < t, B[l] for s <= t
            causal = s_full < t_full if name.startswith("A[") else s_full <= t_full
            tau[sl], prim[sl] = np.where(causal, t_full, s_full), causal
    primal = np.flatnonzero(prim)[np.argsort(tau[prim], kind="stable")]
    dual = np.flatnonzero(~prim)[np.argsort(tau[~prim], kind="stable")]
    cp = np.bincount(tau[prim], minlength=T // points)
    if not np.array_equal(cp, np.bincount(tau[~prim], minlength=T // points)):
        raise AssertionError("primal and dual time blocks differ in size")      # a Layout bug, not user input
    pos = np.zeros(lay.n, int)
    pos[primal] = np.arange(len(primal))
    pos[dual] = np.arange(len(dual))
    return CausalOrder(primal, dual, np.concatenate([[0], np.cumsum(cp)]), prim, pos)


@dataclass
class CausalBlocks:
    """U (dual x primal) and Kd (dual x dual) of the action Hessian, both in :class:`CausalOrder`, and the largest
    primal-primal entry the local Hessians carried (zero at an exact causal saddle)."""
    order: CausalOrder
    U: np.ndarray
    Kd: np.ndarray
    primal_block_max: float


def assemble_blocks(x0, lay: Layout, local_hessians, points: int = 1) -> CausalBlocks:
    """U and Kd from the bilinear part and the local Hessians of ln Z_l.  ``local_hessians``: an iterable of
    (l, h), h the Hessian of ln Z_l over the local variables of layer l (deep_action.log_z_local order), dense or
    as its parts (:class:`dmftc.runtime.solvers.local_hessian.LocalHessian`); each is added and can be freed
    before the next is produced.  ``points``: see :func:`causal_order`."""
    co = causal_order(lay, points)
    n = len(co.primal)
    U = np.zeros((n, n))
    Kd = np.zeros((n, n))
    ia, ib, val = bilinear_pairs(lay)
    if np.any(co.is_primal[ia] == co.is_primal[ib]):
        raise AssertionError("bilinear pairing within one half")
    for a, b in ((ia, ib), (ib, ia)):
        sel = ~co.is_primal[a]
        np.add.at(U, (co.pos[a[sel]], co.pos[b[sel]]), val[sel])
    pp_max = 0.0
    for l, h in local_hessians:
        _, idx = gather_local(np.asarray(x0), lay, l)
        keep = np.flatnonzero(idx >= 0)
        gi = idx[keep]
        d_loc, p_loc = keep[~co.is_primal[gi]], keep[co.is_primal[gi]]
        d_pos, p_pos = co.pos[idx[d_loc]], co.pos[idx[p_loc]]
        U[np.ix_(d_pos, p_pos)] += local_block(h, d_loc, p_loc)
        Kd[np.ix_(d_pos, d_pos)] += local_block(h, d_loc, d_loc)
        if len(p_loc):
            pp_max = max(pp_max, float(np.abs(local_block(h, p_loc, p_loc)).max()))
        del h
    return CausalBlocks(co, U, Kd, pp_max)


_WHY = "too few samples, or dynamics at the edge of stability"

SOLVE_KERNELS = "auto"   # "auto": a deep module's Numba solve kernels where they are faster; "numba"; "numpy"


def back_kernel(model, n: int, rows: int | None, mode: str | None = None):
    """The generated Numba block back substitution of ``model``'s module (``block_back``,
    :mod:`dmftc.codegen.solve_kernels`) for a U of size n and ``rows`` right-hand sides (None: the whole inverse), or
    None for the NumPy block solve.  ``mode`` (default :data:`SOLVE_KERNELS`): 'numba' takes the kernel whenever the
    module has one, 'numpy' never, 'auto' where the kernel is faster counting its compilation
    (:func:`kernel_faster`; measured by ``benchmarks/bench_solve_kernels.py``, recorded in docs/benchmarks.md)."""
    mode = SOLVE_KERNELS if mode is None else mode
    if mode not in ("auto", "numba", "numpy"):
        raise ParameterError(f"solve kernels: 'auto', 'numba' or 'numpy', not {mode!r}")
    back = getattr(getattr(model, "module", None), "block_back", None)
    if back is None or mode == "numpy":
        return None
    if mode == "numba" or kernel_faster(n, rows):
        return back
    return None


KERNEL_FROM = 500       # the smallest U (n) for which 'auto' takes the Numba kernel: below, NumPy's solve and no compilation
KERNEL_UNTIL = 1500     # the largest U whose whole inverse the kernel computes faster than NumPy


def kernel_faster(n: int, rows: int | None) -> bool:
    """Where the Numba kernel beats NumPy's block solve (measured, see :func:`back_kernel`), counting the kernel's
    compilation (2-5 s once per module file, then loaded from Numba's disk cache; in memory only for a module
    compiled from text): from n = :data:`KERNEL_FROM` (the rows of observables at L = 3, T = 10, n = 540: 1.4 ms
    against NumPy's 3.3 ms; 1.0 to 1.3 times faster from n = 1000: it skips U's zero entries, about two thirds of
    those below the diagonal blocks, and makes no LAPACK call per block).  Below that NumPy takes milliseconds
    (L = 2, T = 10, n = 330: 1.6 ms against 0.4 ms), less than compiling the kernel costs.  The whole inverse up to
    n = :data:`KERNEL_UNTIL`, above which NumPy's block-recursive inversion by matrix products (a third of the
    kernel's multiply-adds, at BLAS speed) wins."""
    return n >= KERNEL_FROM and (rows is not None or n <= KERNEL_UNTIL)


def physical_sigma(blocks: CausalBlocks, R, back=None):
    """(R Sigma_phys R^T, info of :func:`dmftc.runtime.solvers.linalg.sandwich`) for rows R over the physical variables
    (the first ``R.shape[1]`` of the Layout; all primal).  ``back``: a generated block back substitution
    (:func:`back_kernel`)."""
    co = blocks.order
    E = np.zeros((R.shape[0], len(co.primal)))
    E[:, co.pos[np.arange(R.shape[1])]] = R
    return sandwich(blocks.U, blocks.Kd, co.edges, E, why=_WHY, back=back)   # = E U^-1 sym(Kd) U^-T E^T


def causal_propagator(sad: Saddle, blocks: CausalBlocks, *, full: bool = False, model=None,
                      observables=None) -> Propagator:
    """Propagator of the time-diagonal observables (Delta, K, Phi[l](t,t), G[l](t,t)) from U and Kd;
    with ``full`` also sigma_phys over the whole packed physical block (otherwise None).  ``observables``: a
    function (saddle, layout) -> (names, rows, J) in place of :func:`dmftc.runtime.problem.deep_action.observable_map`
    (e.g. the observables of every point and pair of a spec on several points)."""
    lay = Layout(sad.L, sad.T)
    t0 = _time.perf_counter()
    names, rows, J = (observable_map(sad, lay, model) if observables is None else observables(sad, lay))
    R = np.eye(lay.n_phys) if full else J
    back = back_kernel(sad.model if model is None else model, blocks.U.shape[0], R.shape[0])
    S, info = physical_sigma(blocks, R, back)
    cond, asym = info["block_cond"], info["asymmetry"]
    So = J @ S @ J.T if full else S
    t1 = _time.perf_counter()
    if not np.all(np.isfinite(So)):
        raise NumericalError("non-finite propagator (overflow in the causal solve)")
    sigma = {a: {b: So[np.ix_(rows[a], rows[b])] for b in names} for a in names}
    ev = sla.eigh(So, eigvals_only=True, driver="evr")
    diag = {"n_vars": lay.n, "n_phys": lay.n_phys, "asymmetry": asym, "u_cond": cond,
            "primal_block_max": blocks.primal_block_max,
            "min_eig": float(ev.min()), "max_eig": float(ev.max()),
            "psd": bool(ev.min() >= -1e-8 * max(ev.max(), 1e-300)), "time_solve": t1 - t0}
    return Propagator(sad, lay, sigma, S if full else None, diag)


def covariance_of_all(blocks: CausalBlocks, model=None) -> np.ndarray:
    """C = -(Hess S)^-1 over every variable (primal and dual, in Layout order), what the O(1/N) mean correction
    contracts with the action's third derivatives: with Hess S = [[0, U^T], [U, Kd]] (primal, dual),
    C = [[U^-1 Kd U^-T, -U^-1], [-U^-T, 0]], from U^-1 by block back substitution (O(n^3), against the
    O((2n)^3) LU of the whole Hessian).  ``model``: its module's Numba kernel where faster (:func:`back_kernel`)."""
    co = blocks.order
    back = back_kernel(model, blocks.U.shape[0], None)
    Y, _ = left_solve(blocks.U, co.edges, why=_WHY, back=back)      # U^-1: (primal, dual) positions
    n = len(co.primal)
    C = np.zeros((2 * n, 2 * n))
    Cpp = Y @ blocks.Kd @ Y.T
    C[np.ix_(co.primal, co.primal)] = 0.5 * (Cpp + Cpp.T)
    C[np.ix_(co.primal, co.dual)] = -Y
    C[np.ix_(co.dual, co.primal)] = -Y.T
    return C
