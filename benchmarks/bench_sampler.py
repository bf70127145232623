"""Benchmark: accuracy at equal cost of randomised quasi-Monte Carlo ('sobol') against pseudo-random ('random')
standard normals (dmftc.runtime.numerics.sampling), for a deep propagator and a two-layer spec.

Run: python benchmarks/bench_sampler.py [--activation 'sin(h)'] [--L 2] [--T 30] [--paths 512] [--groups 8]
         [--two-layer-T 60] [--samples 8192] [--skip-deep] [--skip-two-layer]

For each sampler, the same problem is solved with the same number of paths in the same number of independent
groups; the table gives, per observable, the largest standard error of N Var over time relative to the
curve's peak, the ratio of the time-averaged standard errors (random / sobol), its square (how many times
more random paths the same error would take), and the largest |sobol - random| in combined standard errors
(both are unbiased, so this stays O(1)).  Wall times are reported as the ratio sobol / random, measured in the
same run (each sampler's first call includes its JAX compilation: random runs first and pays for both).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _rows(var, se):
    """var, se: {sampler: {name: (T,) array}} -> printed table."""
    print(f"  {'name':<8}{'se/peak random':>16}{'se/peak sobol':>15}{'se ratio':>10}{'paths x':>9}{'max z':>7}")
    for n in var["random"]:
        peak = float(np.max(np.abs(var["random"][n])))
        if peak == 0:
            continue
        r, s = se["random"][n], se["sobol"][n]
        live = np.hypot(r, s) > 0
        z = np.abs(var["random"][n] - var["sobol"][n])[live] / np.hypot(r, s)[live]
        ratio = float(np.mean(r[live]) / max(np.mean(s[live]), 1e-300))
        print(f"  {n:<8}{r.max() / peak:16.4f}{s.max() / peak:15.4f}{ratio:10.2f}{ratio ** 2:9.1f}{z.max():7.2f}")


def bench_deep(args):
    from dmftc.runtime.problem.deep_action import observable_names
    from dmftc.runtime.engines.deep_propagator import deep_propagator

    var, se, wall = {}, {}, {}
    for smp in ("random", "sobol"):
        t0 = time.perf_counter()
        P = deep_propagator(activation=args.activation, L=args.L, T=args.T, gamma=1.0, y=1.0, eta=0.05,
                            samples=args.paths * args.groups, groups=args.groups, seed=args.seed, sampler=smp)
        wall[smp] = time.perf_counter() - t0
        var[smp] = {n: P.var(n) for n in observable_names(args.L)}
        se[smp] = {n: P.se_var(n) for n in observable_names(args.L)}
    print(f"deep propagator: activation {args.activation}, L = {args.L}, T = {args.T}, {args.groups} groups x "
          f"{args.paths} paths; time sobol / random = {wall['sobol'] / wall['random']:.2f} "
          f"(random {wall['random']:.1f} s, first, with compilation)")
    _rows(var, se)


def bench_two_layer(args):
    import dmftc

    m = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    var, se, mse, wall = {}, {}, {}, {}
    for smp in ("random", "sobol"):
        t0 = time.perf_counter()
        sol = m.solve(samples=args.samples, groups=args.groups, seed=args.seed, T=args.two_layer_T, sampler=smp)
        wall[smp] = time.perf_counter() - t0
        var[smp] = {n: sol.var(n) for n in sol.names}
        se[smp] = {n: sol.var_stderr(n) for n in sol.names}
        mse[smp] = {n: float(np.mean(sol.mean_stderr(n))) for n in sol.names}
    print(f"\ntwo-layer spec two_layer.dmft: T = {args.two_layer_T}, {args.samples} samples in {args.groups} groups; "
          f"time sobol / random = {wall['sobol'] / wall['random']:.2f} (random {wall['random']:.1f} s, first)")
    _rows(var, se)
    print("  standard error of the means, random / sobol: "
          + ", ".join(f"{n} {mse['random'][n] / max(mse['sobol'][n], 1e-300):.1f}" for n in mse["random"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--activation", default="sin(h)")
    ap.add_argument("--L", type=int, default=2)
    ap.add_argument("--T", type=int, default=30)
    ap.add_argument("--paths", type=int, default=512, help="deep: source paths per group")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--two-layer-T", type=int, default=60)
    ap.add_argument("--samples", type=int, default=8192, help="two-layer: samples in all")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip-deep", action="store_true")
    ap.add_argument("--skip-two-layer", action="store_true")
    args = ap.parse_args()
    if not args.skip_deep:
        bench_deep(args)
    if not args.skip_two_layer:
        bench_two_layer(args)


if __name__ == "__main__":
    main()
