"""The generated Numba solve kernels (dmftc.codegen.solve_kernels) and the structured propagator
(runtime.solvers.linalg.coupled_sandwich) against dense reference solves."""
from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.runtime.engines import site_engine
from dmftc.runtime.solvers.linalg import cross_components, right_solve, sandwich, time_edges

ROOT = Path(__file__).resolve().parent.parent
TWO_LAYER = sorted(p.stem for p in (ROOT / "specs").glob("*.dmft")             # the shipped two-layer specs
                   if "\n    'drivers': (" in (ROOT / "generated" / f"{p.stem}.py").read_text())


def _module(name):
    """The generated module as dmftc.load imports it (the name under which Numba caches its kernels)."""
    mod = dmftc.load(ROOT / "specs" / f"{name}.dmft").module
    assert mod.SOLVE_CACHE
    return mod


def _patterned(rng, T, m, cross, identity):
    """A random time-major U whose columns reach later times only at ``cross`` (offsets within a time)."""
    n = T * m
    U = np.zeros((T, m, T, m))
    for t in range(T):
        U[t, :, t, :] = np.eye(m) if identity else np.eye(m) + 0.3 * np.tril(rng.normal(size=(m, m)), -1)
        for s in range(t):
            U[t, :, s, cross] = 0.3 * rng.normal(size=(len(cross), m))
    return U.reshape(n, n)


def test_every_two_layer_module_has_kernels():
    assert {"two_layer", "two_layer_multi", "linear_whitened", "eos"} <= set(TWO_LAYER)
    for name in TWO_LAYER:
        mod = _module(name)
        assert callable(mod.causal_forward) and callable(mod.causal_back), name
        assert mod.SOLVE_CROSS == mod.SITE["drivers"]


@pytest.mark.parametrize("name", TWO_LAYER)
@pytest.mark.parametrize("m, cross", [(1, [0]), (4, [0]), (5, [1, 3])])
def test_kernels_match_dense_solves(name, m, cross):
    mod = _module(name)
    rng = np.random.default_rng(m)
    T = 9
    U = _patterned(rng, T, m, cross, mod.SOLVE_IDENTITY)
    n = T * m
    Dinv = np.stack([np.linalg.inv(U[t * m:(t + 1) * m, t * m:(t + 1) * m]) for t in range(T)])
    B = rng.normal(size=(n, 3))
    c = np.asarray(cross, dtype=np.int64)
    X = mod.causal_forward(U, B, Dinv, c)
    ref = np.linalg.solve(U, B)
    assert np.abs(X - ref).max() <= 1e-12 * np.abs(ref).max()
    Y = mod.causal_back(U, B, Dinv, c)
    ref = np.linalg.solve(U.T, B)
    assert np.abs(Y - ref).max() <= 1e-12 * np.abs(ref).max()


def test_kernels_with_non_identity_blocks():
    """The general variant (a constraint reading another order parameter at its own time): emitted text run
    here, against the dense solve."""
    from dmftc.codegen.solve_kernels import emit_solve_kernels

    parts: list[str] = []
    emit_solve_kernels(parts.append, cross=("Delta",), same_time=(("K", ("Delta",)),))
    ns = {"np": np, "numba": importlib.import_module("numba")}
    exec("".join(parts), ns)                        # from text: no on-disk cache
    assert ns["SOLVE_IDENTITY"] is False
    rng = np.random.default_rng(3)
    T, m, cross = 8, 3, [0]
    U = _patterned(rng, T, m, cross, identity=False)
    Dinv = np.stack([np.linalg.inv(U[t * m:(t + 1) * m, t * m:(t + 1) * m]) for t in range(T)])
    B = rng.normal(size=(T * m, 2))
    c = np.asarray(cross, dtype=np.int64)
    for fn, A in (("causal_forward", U), ("causal_back", U.T)):
        ref = np.linalg.solve(A, B)
        assert np.abs(ns[fn](U, B, Dinv, c) - ref).max() <= 1e-12 * np.abs(ref).max()


@pytest.mark.parametrize("identity", [True, False])
def test_coupled_sandwich_matches_dense(identity):
    """The propagator through the cross columns (Woodbury) = the dense U^-1 K U^-T, and U's exact condition."""
    rng = np.random.default_rng(4)
    T, m = 30, 4
    U = _patterned(rng, T, m, [0], identity)
    assert list(cross_components(U, T)) == [True, False, False, False]
    B = rng.normal(size=(T * m, 200))
    K = B @ B.T
    S, info = sandwich(U, K, time_edges(T, m))
    X = np.linalg.inv(U)
    ref = X @ K @ X.T
    assert np.abs(S - ref).max() <= 1e-12 * np.abs(ref).max()
    assert info["cond"] == pytest.approx(np.linalg.cond(U, 1), rel=1e-12)
    H, info_half = sandwich(U, K, time_edges(T, m), half=True)         # the unsymmetrised half: S = H + H^T
    np.testing.assert_array_equal(H + H.T, S)
    assert info_half["cond"] == info["cond"]


def test_causal_solver_picks_the_kernel_and_agrees():
    mod = dmftc.load(ROOT / "specs" / "two_layer.dmft").module
    T = 12
    shapes = {n: (1, T) for n, _ in mod.ORDERS}
    rng = np.random.default_rng(5)
    U = _patterned(rng, T, 4, [0], True)
    B = rng.normal(size=(4 * T, 6))
    solve, how = site_engine.causal_solver(mod, U, T, shapes)
    slow, how_np = site_engine.causal_solver(mod, U, T, shapes, mode="numpy")
    assert (how, how_np) == ("numba", "numpy")
    ref = right_solve(U, time_edges(T, 4), B)
    assert np.abs(solve(B) - ref).max() <= 1e-12 * np.abs(ref).max()
    assert np.abs(solve(B[:, 0]) - ref[:, 0]).max() <= 1e-12 * np.abs(ref).max()
    U2 = U.copy()
    U2[8, 1] = 0.5                                 # a non-driver column reaching a later time: not the pattern
    assert site_engine.causal_solver(mod, U2, T, shapes)[1] == "numpy"
    with pytest.raises(dmftc.errors.ParameterError, match="solve kernels"):
        site_engine.causal_solver(mod, U, T, shapes, mode="fast")


def test_two_layer_solution_unchanged_by_the_kernels(monkeypatch):
    """specs/two_layer.dmft with its O(1/N) correction (the kernels' caller): the same to round-off with the
    NumPy block solves."""
    model = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    kw = dict(samples=400, T=8, seed=1, groups=2, correction=True)
    fast = model.solve(**kw)
    monkeypatch.setattr(site_engine, "SOLVE_KERNELS", "numpy")
    slow = model.solve(**kw)
    for name in ("Delta", "K"):
        a, b = np.asarray(fast.m1[name]), np.asarray(slow.m1[name])
        assert np.abs(a - b).max() <= 1e-10 * np.abs(b).max() and np.abs(b).max() > 0
        np.testing.assert_allclose(fast.var(name), slow.var(name), rtol=1e-12)
