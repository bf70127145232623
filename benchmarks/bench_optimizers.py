"""Benchmark: what momentum, weight decay and a schedule cost against plain gradient descent (two-layer specs).

Run: python benchmarks/bench_optimizers.py [--T 40 100] [--samples 20000] [--repeat 7]

Whole Monte Carlo solves (saddle, moments and propagator), steady state (each case is solved once first to trace
and compile), of ``specs/two_layer.dmft`` (plain gradient descent; one train and one test point: Delta, f_star,
K, K_star), ``specs/two_layer_sgd.dmft`` with beta = lam = 0 and lr = 1 (the same optimiser as plain gradient
descent, written as recurrences: Delta, K) and with beta = 0.9, lam = 0.1 and a warm-up + cosine schedule, at
the same T and number of samples.  The cases are interleaved ``--repeat`` times, so that the machine's load
falls on all of them alike; printed: each case's median and best time and their ratios to two_layer's (on a
loaded machine the best of several runs is the steadier measure).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def cosine(T: int) -> np.ndarray:
    """Warm-up over T/6 steps from 0 to 1, cosine decay to 0.1 at step T (optax.schedules)."""
    import optax

    s = optax.schedules.warmup_cosine_decay_schedule(init_value=0.0, peak_value=1.0, warmup_steps=max(1, T // 6),
                                                     decay_steps=T, end_value=0.1)
    return np.array([float(s(t)) for t in range(T)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[40, 100])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    import dmftc

    plain = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    sgd = dmftc.load(ROOT / "specs" / "two_layer_sgd.dmft")
    print(f"{'T':>4} {'case':<46} {'median s':>9} {'ratio':>6} {'best s':>7} {'ratio':>6}")
    for T in args.T:
        cases = {"two_layer (plain GD)": (plain, {}),
                 "two_layer_sgd, beta = lam = 0, lr = 1": (sgd, dict(beta=0.0, lam=0.0, lr=np.ones(T))),
                 "two_layer_sgd, beta = 0.9, lam = 0.1, cosine": (sgd, dict(beta=0.9, lam=0.1, lr=cosine(T)))}

        def solve(model, kw):
            t0 = time.perf_counter()
            sol = model.solve(T=T, eta=0.05, samples=args.samples, seed=0, progress=False, backend="mc", **kw)
            sol.var("K")                                    # the propagator, if the solve left it for later
            return time.perf_counter() - t0

        for model, kw in cases.values():                    # trace and compile
            solve(model, kw)
        times = {k: [] for k in cases}
        for _ in range(args.repeat):
            for k, (model, kw) in cases.items():
                times[k].append(solve(model, kw))
        ref = times["two_layer (plain GD)"]
        for k, ts in times.items():
            print(f"{T:>4} {k:<46} {np.median(ts):>9.2f} {np.median(ts) / np.median(ref):>6.2f} {min(ts):>7.2f} "
                  f"{min(ts) / min(ref):>6.2f}")


if __name__ == "__main__":
    main()
