"""Benchmark: the deep ensembles of dmftc.validation with lazily and densely drawn hidden matrices.

Run: python benchmarks/bench_deep_ensemble.py [--N 256 512] [--E 2000] [--T 10] [--L 2] [--points 1] [--repeat 2]

For each width, ``simulate_deep`` trains the same number of tanh networks with ``weights='lazy'`` (each product
of a hidden matrix drawn from its conditional law, dmftc.validation.lazy_gaussian) and ``weights='dense'``
(every entry drawn up front), alternating the two ``--repeat`` times in this process, and prints the best time
of each, their ratio, and the largest difference of N Var between the two in units of its standard error (the
two draw different networks, so this is a statistical check, not an identity).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    from dmftc.validation.deep_ensemble import simulate_deep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--E", type=int, default=2000)
    ap.add_argument("--T", type=int, default=10)
    ap.add_argument("--L", type=int, default=2)
    ap.add_argument("--points", type=int, default=1, help="training points (a random Gram matrix) or 1")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if args.points > 1:
        Z = np.random.default_rng(0).standard_normal((args.points, 6))
        extra = dict(Kx=Z @ Z.T / 6, y=np.linspace(1.0, -0.5, args.points))
    else:
        extra = dict(y=1.0)
    kw = dict(activation="tanh", L=args.L, gamma=1.0, eta=0.05, T=args.T, E=args.E, **extra)
    print(f"deep tanh ensembles: L = {args.L}, T = {args.T}, P = {args.points}, E = {args.E} networks")
    print(f"{'N':>6} {'lazy s':>9} {'dense s':>9} {'dense/lazy':>11} {'max z N Var':>12}")
    for N in args.N:
        best = {"lazy": np.inf, "dense": np.inf}
        res = {}
        for _ in range(args.repeat):
            for w in ("lazy", "dense"):
                t0 = time.perf_counter()
                res[w] = simulate_deep(N=N, seed=1 if w == "lazy" else 2, weights=w, **kw)
                best[w] = min(best[w], time.perf_counter() - t0)
        z = 0.0
        for q in res["lazy"].nvar:
            a, b = res["lazy"], res["dense"]
            se = np.hypot(a.se_nvar[q], b.se_nvar[q])
            ok = se > 1e-12 * max(1.0, float(np.abs(a.nvar[q]).max()))     # (exact zeros at t = 0)
            if ok.any():
                z = max(z, float(np.max(np.abs(a.nvar[q] - b.nvar[q])[ok] / se[ok])))
        print(f"{N:>6} {best['lazy']:9.2f} {best['dense']:9.2f} {best['dense'] / best['lazy']:11.1f} {z:12.2f}")


if __name__ == "__main__":
    main()
