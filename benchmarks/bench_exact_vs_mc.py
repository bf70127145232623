"""Benchmark: exact Gaussian backend vs Monte Carlo for linear_whitened (P = 10, T = 200).

Run: python benchmarks/bench_exact_vs_mc.py [--P 10] [--T 200] [--samples 2000]
Prints wall-clock times (first call includes compilation; second is steady state),
the ratio, and the largest difference of N Var(Delta) between the backends in
units of the Monte Carlo standard error.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=10)
    ap.add_argument("--T", type=int, default=200)
    ap.add_argument("--samples", type=int, default=2_000)
    args = ap.parse_args()
    import dmftc

    m = dmftc.load(ROOT / "specs" / "linear_whitened.dmft")
    params = dict(P=args.P, T=args.T, eta=0.02, gamma=1.0)
    rows = {}
    for backend in ("exact", "mc"):
        kw = dict(backend=backend, samples=args.samples, **params)
        _, first = timed(lambda: m.solve(**kw))
        sol, second = timed(lambda: m.solve(**kw))
        rows[backend] = (sol, first, second)
        print(f"{backend:>6}: first {first:7.2f} s   steady {second:7.2f} s   "
              f"({'no sampling' if backend == 'exact' else f'{args.samples} samples'})")
    ex, mc = rows["exact"][0], rows["mc"][0]
    z = np.abs(mc.var("Delta") - ex.var("Delta"))[:, 1:] / mc.stderr("Delta")[:, 1:]
    print(f"steady-state time ratio mc / exact: {rows['mc'][2] / rows['exact'][2]:.1f}")
    print(f"max |N Var_mc - N Var_exact| / se_mc over components and times: {z.max():.2f}")


if __name__ == "__main__":
    main()
