"""Benchmark: the cubature backend's accuracy and cost, against a large Monte Carlo solve in the same run.

Run: python benchmarks/bench_cubature.py [--T 100] [--nodes 40] [--mc 1000000] [--gammas 0.5 1.5] [--multi]

Part 1, ``specs/two_layer.dmft`` (tanh) at T steps for each gamma: the cubature solve with ``nodes``^3 points
(its error estimate from the coarser rule), first call (tracing and compilation) and second; its worst estimated
error of N Var relative to each curve's peak |N Var| (Delta, f_star, K, K_star); then a Monte Carlo solve with
``mc`` paths (8 groups) and the largest pointwise z = |cubature - mc| / sqrt(err^2 + se^2) over every curve and
time of N Var, with the Monte Carlo's own worst standard error over the peak.
Part 2 (``--multi``): the cost of the other shipped cubature cases, two_layer_multi with tanh on P = 4 points
(5 source coordinates, sparse grids) and linear_whitened on P = 8 (against the exact backend, to round-off),
and a Monte Carlo solve of two_layer_multi of the same time for comparison.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from bench_time_to_accuracy import Curves, accuracy, max_z, peaks, timed

ROOT = Path(__file__).resolve().parent.parent
CURVES = ("Delta", "f_star", "K", "K_star")


def curves(sol, names) -> Curves:
    """N Var of ``names`` and its error bars, as the time-to-accuracy benchmark compares them."""
    return Curves({n: np.asarray(sol.var(n)) for n in names}, {n: np.asarray(sol.var_stderr(n)) for n in names})


def worst_over_peak(sol, names) -> float:
    """max over curves and times of (error bar of N Var) / (the curve's peak |N Var|)."""
    c = curves(sol, names)
    return accuracy(c, peaks(c))


def part_one(args):
    import dmftc

    m = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    print(f"two_layer (tanh), T = {args.T}: cubature {args.nodes}^3 nodes against Monte Carlo, {args.mc} paths")
    print(f"{'gamma':>6} {'cub first s':>12} {'cub s':>7} {'cub err/peak':>13} {'mc s':>7} {'mc se/peak':>11} "
          f"{'max z':>6}")
    for gamma in args.gammas:
        kw = dict(T=args.T, gamma=gamma)
        _, first = timed(lambda: m.solve(backend="cubature", samples=args.nodes ** 3, **kw))
        cub, second = timed(lambda: m.solve(backend="cubature", samples=args.nodes ** 3, **kw))
        mc, t_mc = timed(lambda: m.solve(backend="mc", samples=args.mc, seed=1, **kw))
        print(f"{gamma:>6} {first:>12.1f} {second:>7.1f} {100 * worst_over_peak(cub, CURVES):>12.3f}% "
              f"{t_mc:>7.1f} {100 * worst_over_peak(mc, CURVES):>10.3f}% {max_z(curves(cub, CURVES), curves(mc, CURVES)):>6.2f}")


def part_two(args):
    import dmftc

    text = (ROOT / "specs" / "two_layer_multi.dmft").read_text()
    relu = "activation phi(h) = sqrt(2) * max(0, h)"
    assert relu in text
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "two_layer_multi_tanh.dmft"
        spec.write_text(text.replace(relu, "activation phi(h) = tanh(h)")
                        .replace("model two_layer_multi ", "model two_layer_multi_tanh "))
        m = dmftc.load(spec, out_dir=Path(tmp) / "generated")
        names = ("Delta", "K")
        print(f"\ntwo_layer_multi with tanh, P = 4 (5 source coordinates), T = {args.T}, gamma = 1")
        print(f"{'backend':>10} {'points':>8} {'first s':>8} {'s':>6} {'err/peak':>9}")
        for budget in (2000, 20000, 200000):
            _, first = timed(lambda: m.solve(backend="cubature", samples=budget, T=args.T))
            sol, t = timed(lambda: m.solve(backend="cubature", samples=budget, T=args.T))
            print(f"{'cubature':>10} {sol.info['samples']:>8} {first:>8.1f} {t:>6.1f} "
                  f"{100 * worst_over_peak(sol, names):>8.2f}%")
        for paths in (20000, 100000):
            _, first = timed(lambda: m.solve(backend="mc", samples=paths, T=args.T, seed=0))
            sol, t = timed(lambda: m.solve(backend="mc", samples=paths, T=args.T, seed=0))
            print(f"{'mc':>10} {paths:>8} {first:>8.1f} {t:>6.1f} {100 * worst_over_peak(sol, names):>8.2f}%")
    m = dmftc.load(ROOT / "specs" / "linear_whitened.dmft")
    print(f"\nlinear_whitened, P = 8 (9 source coordinates), T = {args.T}")
    ex, t_ex = timed(lambda: m.solve(backend="exact", P=8, T=args.T))
    for budget in (2000, 20000):
        _, first = timed(lambda: m.solve(backend="cubature", P=8, T=args.T, samples=budget))
        cub, t = timed(lambda: m.solve(backend="cubature", P=8, T=args.T, samples=budget))
        diff = float(np.max(np.abs(cub.var("Delta") - ex.var("Delta"))) / np.max(np.abs(ex.var("Delta"))))
        print(f"cubature {cub.info['samples']} points: first {first:.1f} s, {t:.1f} s; exact {t_ex:.1f} s; "
              f"max |difference| / peak of N Var Delta {diff:.1e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--mc", type=int, default=1_000_000)
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.5, 1.5])
    ap.add_argument("--multi", action="store_true", help="also part 2: two_layer_multi (tanh) and linear_whitened")
    args = ap.parse_args()
    part_one(args)
    if args.multi:
        part_two(args)


if __name__ == "__main__":
    main()
