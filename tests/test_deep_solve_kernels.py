"""The deep modules' generated Numba solve kernels (dmftc.codegen.solve_kernels: block_back, block_forward) against
dense reference solves and the NumPy block solves (dmftc.runtime.solvers.linalg), and the deep solutions unchanged by them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.errors import NumericalError, ParameterError
from dmftc.runtime.solvers import causal_solve
from dmftc.runtime.solvers.causal_solve import back_kernel
from dmftc.runtime.solvers.linalg import kernel_back, left_solve, lower_inverse, right_solve

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(p.stem for p in (ROOT / "specs").glob("*.dmft"))
DEEP = [s for s in SPECS if "\nKIND = 'deep'\n" in (ROOT / "generated" / f"{s}.py").read_text()]


def _module(name):
    """The generated module as dmftc.load imports it (the name under which Numba caches its kernels)."""
    return dmftc.load(ROOT / "specs" / f"{name}.dmft").module


def _causal_u(rng, T, zeros=0.6):
    """A random U block lower triangular in time with diagonal blocks growing as a deep action's (3 (t + 1)
    variables at time t), about ``zeros`` of its entries zero, and well-conditioned diagonal blocks whose
    elimination needs row exchanges (the rows of 3 + noise on the diagonal moved down by one)."""
    sizes = 3 * (np.arange(T) + 1)
    edges = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(edges[-1])
    U = rng.normal(size=(n, n)) * (rng.random((n, n)) > zeros)
    for b in range(T):
        lo, hi = edges[b], edges[b + 1]
        U[lo:hi, hi:] = 0.0
        U[lo:hi, lo:hi] += 3.0 * np.eye(hi - lo)
        U[lo:hi, lo:hi] = U[lo:hi, lo:hi][np.roll(np.arange(hi - lo), 1)]      # pivoting needed:
        U[lo, lo] = 0.0                                                          # a zero leading pivot
    return U, edges


def test_every_shipped_module_has_its_solve_kernels():
    """Every shipped spec's generated module holds Numba solve kernels: the deep ones block substitution, the
    two-layer ones the cross-column substitution (tests/test_numba_kernels.py)."""
    assert {"deep_tanh", "deep_linear", "deep_multi", "deep_logistic", "deep_sgd"} <= set(DEEP)
    for name in SPECS:
        text = (ROOT / "generated" / f"{name}.py").read_text()
        assert "@numba.njit(cache=SOLVE_CACHE)" in text, name
    for name in DEEP:
        mod = _module(name)
        assert mod.SOLVE_BLOCKS == "time" and mod.SOLVE_CACHE, name
        assert callable(mod.block_back) and callable(mod.block_forward) and callable(mod.block_inverse), name


@pytest.mark.parametrize("name", DEEP)
def test_block_kernels_match_dense_solves(name):
    mod = _module(name)
    rng = np.random.default_rng(len(name))
    U, edges = _causal_u(rng, 7)
    n = U.shape[0]
    E = rng.normal(size=(5, n))
    Y, cond = mod.block_back(U, E, edges)
    ref = np.linalg.solve(U.T, E.T).T
    assert np.abs(Y - ref).max() <= 1e-12 * np.abs(ref).max()
    B = rng.normal(size=(n, 4))
    X, cond_f = mod.block_forward(U, B, edges)
    ref = np.linalg.solve(U, B)
    assert np.abs(X - ref).max() <= 1e-12 * np.abs(ref).max()
    for b in range(len(edges) - 1):                     # the exact 1-norm condition numbers of the diagonal blocks
        D = U[edges[b]:edges[b + 1], edges[b]:edges[b + 1]]
        assert cond[b] == pytest.approx(np.linalg.cond(D, 1), rel=1e-10)
    np.testing.assert_array_equal(cond, cond_f)


def test_kernel_and_numpy_block_solves_agree():
    """linalg.left_solve through the kernel (rows and the whole inverse) equals the NumPy block solve."""
    mod = _module("deep_tanh")
    rng = np.random.default_rng(7)
    U, edges = _causal_u(rng, 9, zeros=0.3)
    E = rng.normal(size=(6, U.shape[0]))
    Y0, c0 = left_solve(U, edges, E)
    Y1, c1 = left_solve(U, edges, E, back=mod.block_back)
    assert np.abs(Y1 - Y0).max() <= 1e-12 * np.abs(Y0).max()
    assert c1 >= c0 * (1 - 1e-12)                          # exact 1-norm condition >= LAPACK's estimate
    X0, _ = lower_inverse(U, edges)
    X1, _ = kernel_back(mod.block_back, U, edges, None)
    assert np.abs(X1 - X0).max() <= 1e-12 * np.abs(X0).max()
    for lo, hi in zip(edges[:-1], edges[1:]):             # U^-1 is block lower triangular too
        assert not np.any(X1[lo:hi, hi:])
    B = rng.normal(size=(U.shape[0], 3))
    X = right_solve(U, edges, B)
    assert np.abs(mod.block_forward(U, B, edges)[0] - X).max() <= 1e-12 * np.abs(X).max()


@pytest.mark.parametrize("bad", ["zero", "nan"])
def test_singular_block_named_by_both_paths(bad):
    mod = _module("deep_tanh")
    rng = np.random.default_rng(3)
    U, edges = _causal_u(rng, 6)
    lo, hi = edges[3], edges[4]
    if bad == "zero":
        U[lo + 1, lo:hi] = 0.0                              # a zero row: exactly singular
    else:
        U[lo + 2, lo + 1] = np.nan
    E = rng.normal(size=(2, U.shape[0]))
    for back in (None, mod.block_back):
        with pytest.raises(NumericalError, match="singular at time 3" if bad == "zero" else "non-finite .* time 3"):
            left_solve(U, edges, E, back=back)


def test_back_kernel_choice():
    mod = _module("deep_tanh")

    class Model:
        module = mod

    assert back_kernel(Model, 500, 60, "numba") is mod.block_back
    assert back_kernel(Model, 500, 60, "numpy") is None
    assert back_kernel(object(), 500, 60, "numba") is None            # no module, no kernel
    # 'auto': the kernel where it is faster counting its compilation (docs/benchmarks.md)
    assert back_kernel(Model, 540, 80, "auto") is mod.block_back      # observables at L = 3, T = 10: 3.3 ms / 1.4 ms
    assert back_kernel(Model, 1260, 120, "auto") is mod.block_back    # observables at L = 2, T = 20: 11 ms / 8 ms
    assert back_kernel(Model, 4920, 240, "auto") is mod.block_back
    assert back_kernel(Model, 1260, None, "auto") is mod.block_back   # a whole inverse up to n = 1500: the kernel
    assert back_kernel(Model, 330, 60, "auto") is None                # L = 2, T = 10: milliseconds, no compilation
    assert back_kernel(Model, 330, None, "auto") is None
    assert back_kernel(Model, 4000, None, "auto") is None             # a large whole inverse: NumPy's BLAS
    with pytest.raises(ParameterError, match="solve kernels"):
        back_kernel(Model, 500, 60, "fast")


def _solve_both(monkeypatch, name, **kw):
    out = {}
    for mode in ("numpy", "numba"):
        monkeypatch.setattr(causal_solve, "SOLVE_KERNELS", mode)
        out[mode] = dmftc.load(ROOT / "specs" / f"{name}.dmft").solve(**kw)
    return out["numpy"], out["numba"]


def test_deep_tanh_propagator_unchanged_by_the_kernels(monkeypatch):
    ref, sol = _solve_both(monkeypatch, "deep_tanh", L=2, T=5, eta=0.1, gamma=1.3, y=-0.6, samples=200,
                           propagator_samples=400, propagator_groups=2, seed=2)
    for n in ("Delta", "K", "Phi[1]", "G[2]"):
        r = ref.var(n)
        assert np.abs(r).max() > 0
        np.testing.assert_allclose(sol.var(n), r, rtol=0, atol=1e-12 * np.abs(r).max())


def test_deep_linear_propagator_and_correction_unchanged_by_the_kernels(monkeypatch):
    """The exact propagator (whole physical block) and the O(1/N) mean correction (the whole inverse of U)."""
    ref, sol = _solve_both(monkeypatch, "deep_linear", L=2, T=5, eta=0.2, gamma=1.1, y=0.7, correction=True)
    for n in ("Delta", "K", "Phi[2]", "G[1]"):
        for a, b in ((sol.var(n), ref.var(n)), (sol.mean_correction(n), ref.mean_correction(n))):
            assert np.abs(b).max() > 0
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(b).max())
    np.testing.assert_allclose(sol.sigma("K", "Phi[1]"), ref.sigma("K", "Phi[1]"), rtol=0,
                               atol=1e-12 * np.abs(ref.sigma("K", "Phi[1]")).max())
