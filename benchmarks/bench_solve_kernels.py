"""Benchmark: the generated Numba solve kernels against the NumPy block solves, to show where each path wins.

Run: python benchmarks/bench_solve_kernels.py [--repeat 3] [--deep-T 10 20 30 40] [--two-layer-T 100 250]
                                               [--blas-threads K]

* Deep specs (``block_back`` of generated/deep_linear.py, the same text in every deep module): the U of the exact
  deep-linear action (specs/deep_linear.dmft, L = 2 and 3; the nonlinear specs' U has the same causal layout, with
  Monte Carlo entries), solved (a) for the rows of the time-diagonal observables (Delta, K, Phi[l], G[l]), as
  every deep propagator does, and (b) for the whole inverse, as the O(1/N) mean correction does.  NumPy:
  :func:`dmftc.runtime.solvers.linalg.left_solve` (block back substitution with LAPACK per block, or for the inverse the
  block-recursive inversion by matrix products).
* Two-layer specs (``causal_forward`` of generated/two_layer.py): a random time-major U with the two_layer pattern
  (m = 4 components per time, columns reaching later times at one of them, identity diagonal blocks), 1 and 1250
  right-hand sides, against :func:`dmftc.runtime.solvers.linalg.right_solve`.

Both paths run interleaved ``--repeat`` times in one process, after one call that compiles the kernels (NumPy's BLAS
on ``--blas-threads`` threads, default all; a two-layer solve runs it on one thread when JAX computes on the CPU,
:func:`dmftc.runtime.numerics.devices.serial_blas_on_cpu`, a deep one on all); printed:
the best time of each, their ratio (> 1: the kernel wins), the largest difference relative to the largest entry,
and the path :func:`dmftc.runtime.solvers.causal_solve.back_kernel` chooses ('auto').
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def best(fns, repeat):
    """Best time of each function, calls interleaved; and each one's last result."""
    times = [np.inf] * len(fns)
    out = [None] * len(fns)
    for _ in range(repeat):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            out[i] = f()
            times[i] = min(times[i], time.perf_counter() - t0)
    return times, out


def deep_rows(L, T):
    """(U, edges, E) of the exact deep-linear action at L, T: E the rows of the time-diagonal observables."""
    import dmftc
    from dmftc.runtime.solvers.causal_solve import causal_order
    from dmftc.runtime.problem.deep_action import Layout, observable_map, saddle_point_vector
    from dmftc.runtime.engines.deep_linear import deep_linear_saddle, linear_blocks
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.problem.params import resolve_deep_params

    mod = dmftc.load(ROOT / "specs" / "deep_linear.dmft").module
    p, L, T = resolve_deep_params(mod, {"L": L, "T": T})
    sad = deep_linear_saddle(L=L, T=T, model=from_spec(mod, p))
    lay = Layout(L, T)
    blocks = linear_blocks(saddle_point_vector(sad), lay, sad.model)
    _, _, J = observable_map(sad, lay, sad.model)
    co = causal_order(lay)
    E = np.zeros((J.shape[0], len(co.primal)))
    E[:, co.pos[np.arange(J.shape[1])]] = J
    return mod, np.ascontiguousarray(blocks.U), co.edges.astype(np.int64), E


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--deep-T", type=int, nargs="+", default=[10, 20, 30, 40])
    ap.add_argument("--two-layer-T", type=int, nargs="+", default=[100, 250])
    ap.add_argument("--blas-threads", type=int, default=None, help="NumPy's BLAS threads (default: all)")
    args = ap.parse_args()
    import scipy.linalg  # noqa: F401  (its own BLAS, loaded before the limit: a library loaded later keeps its threads)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=args.blas_threads, user_api="blas"):
        run(args)


def run(args):

    import dmftc
    from dmftc.runtime.solvers.causal_solve import kernel_faster
    from dmftc.runtime.solvers.linalg import kernel_back, left_solve, right_solve, time_edges

    def rel(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())

    from threadpoolctl import threadpool_info

    threads = sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
    print(f"NumPy's and SciPy's BLAS on {' / '.join(map(str, threads))} thread(s)")
    print(f"{'case':<34} {'n':>6} {'rhs':>5} {'numpy s':>9} {'numba s':>9} {'ratio':>7} {'rel diff':>9} {'auto':>6}")
    cases = [(2, T) for T in args.deep_T] + [(3, T) for T in args.deep_T if T <= 30]
    for L, T in cases:
        mod, U, edges, E = deep_rows(L, T)
        n = U.shape[0]
        mod.block_back(U[:edges[2], :edges[2]], E[:1, :edges[2]], edges[:3])       # compile (or load the cache)
        (tn, tk), (Yn, Yk) = best([lambda: left_solve(U, edges, E)[0],
                                   lambda: kernel_back(mod.block_back, U, edges, E)[0]], args.repeat)
        auto = "numba" if kernel_faster(n, E.shape[0]) else "numpy"
        print(f"{f'deep L = {L}, T = {T}, observables':<34} {n:>6} {E.shape[0]:>5} {tn:>9.4f} {tk:>9.4f} "
              f"{tn / tk:>7.2f} {rel(Yk, Yn):>9.1e} {auto:>6}")
        if n <= 8000:
            (tn, tk), (Yn, Yk) = best([lambda: left_solve(U, edges)[0],
                                       lambda: kernel_back(mod.block_back, U, edges, None)[0]], max(1, args.repeat - 1))
            auto = "numba" if kernel_faster(n, None) else "numpy"
            print(f"{f'deep L = {L}, T = {T}, whole inverse':<34} {n:>6} {n:>5} {tn:>9.4f} {tk:>9.4f} "
                  f"{tn / tk:>7.2f} {rel(Yk, Yn):>9.1e} {auto:>6}")
    two = dmftc.load(ROOT / "specs" / "two_layer.dmft").module
    rng = np.random.default_rng(0)
    m = 4
    for T in args.two_layer_T:
        n = T * m
        U = np.zeros((T, m, T, m))
        for t in range(T):
            U[t, :, t, :] = np.eye(m)
            U[t, :, :t, 0] = 0.3 * rng.normal(size=(m, t)) / np.sqrt(T)
        U = U.reshape(n, n)
        edges = time_edges(T, m)
        Dinv = np.broadcast_to(np.eye(m), (T, m, m)).copy()
        cross = np.array([0], dtype=np.int64)
        for k in (1, 1250):
            B = rng.normal(size=(n, k))
            two.causal_forward(U, B[:, :1], Dinv, cross)
            (tn, tk), (Xn, Xk) = best([lambda: right_solve(U, edges, B),
                                       lambda: two.causal_forward(U, B, Dinv, cross)], args.repeat)
            print(f"{f'two_layer T = {T}, forward':<34} {n:>6} {k:>5} {tn:>9.4f} {tk:>9.4f} {tn / tk:>7.2f} "
                  f"{rel(Xk, Xn):>9.1e} {'numba':>6}")


if __name__ == "__main__":
    main()
