"""Benchmark: two_layer at T = 250 with 1e4 and 1e5 samples (compile, solve, propagator, memory).

Run: python benchmarks/bench_two_layer.py [--samples 10000 100000] [--T 250] [--correction]
Prints wall-clock times of each stage (the first solve includes JAX tracing and
XLA compilation; the second is the steady state), the peak resident memory, and the whole solve in "matmul units":
its time over that of one 1000 x 1000 float64 matrix product timed in the same process (best of 5, the mean of
its timings just before and after the solve: the machine's speed, and most of its load, cancel out of the ratio).
``--correction`` also computes the O(1/N) mean correction and prints its time as a ratio to the
saddle + moments + propagator time of the same solve (the issue's target: at most 3).
"""
from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def matmul_unit(repeat: int = 5) -> float:
    """Seconds of one 1000 x 1000 float64 matmul (NumPy's BLAS), best of ``repeat``."""
    import numpy as np

    a, b = np.random.default_rng(0).normal(size=(2, 1000, 1000))
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--T", type=int, default=250)
    ap.add_argument("--spec", default=str(ROOT / "specs" / "two_layer.dmft"))
    ap.add_argument("--correction", action="store_true", help="also time the O(1/N) mean correction")
    args = ap.parse_args()

    from dmftc.compiler import generate

    t0 = time.perf_counter()
    generate(Path(args.spec))
    t_compile = time.perf_counter() - t0
    import dmftc

    model = dmftc.load(args.spec)
    print(f"spec {Path(args.spec).name}: dmftc compile (parse, check, derive, lower, emit) {t_compile:.2f} s")
    print(f"one 1000 x 1000 matmul: {matmul_unit() * 1e3:.1f} ms (1 unit; re-timed before and after each solve)")
    print(f"{'samples':>8} {'run':>6} {'total s':>8} {'units':>6} {'saddle s':>9} {'moments s':>10} "
          f"{'propagator s':>13} {'peak MB':>8}" + (f" {'correction s':>13} {'ratio':>6}" if args.correction else ""))
    for S in args.samples:
        for run in ("first", "second"):
            before = matmul_unit()
            t0 = time.perf_counter()
            sol = model.solve(samples=S, T=args.T, seed=0, correction=args.correction, backend="mc")
            total = time.perf_counter() - t0
            unit = 0.5 * (before + matmul_unit())        # the machine's speed around this solve
            tm = sol.info["timings"]
            extra = ""
            if args.correction:
                base = tm["saddle"] + tm["moments"] + tm["propagator"]
                extra = f" {tm['mean correction']:>13.2f} {tm['mean correction'] / base:>6.2f}"
            print(f"{S:>8} {run:>6} {total:>8.2f} {total / unit:>6.0f} {tm['saddle']:>9.2f} {tm['moments']:>10.2f} "
                  f"{tm['propagator']:>13.2f} {peak_mb():>8.0f}{extra}")
    print("ratio of steady-state times for 10x samples shows the Monte Carlo scaling (ideal: 10)")


if __name__ == "__main__":
    main()
