"""Benchmark: deep networks -- time and peak memory against T and L.

Run: python benchmarks/bench_deep.py [--what linear linear_m1 mc] [--T 10 20 30] [--L 2 3] [--samples 20000]
         [--against DIR]

* linear: dmftc.deep.solve_deep(activation="linear"): exact saddle + propagator of the closed-form Gaussian
  action (n = 2 L T(T+1) + 2 (L-1) T^2 + 2 T variables; each ln Z_l's Hessian by JAX, the blocks U and Kd
  assembled and solved causally: memory O(n^2) = O(L^2 T^4), solve O(n_phys n^2 / 4) with n_phys ~ n / 2).
* linear_m1: the same with the exact O(1/N) mean correction (correction=True: the whole inverse from U^-1,
  and third directional derivatives of each layer's ln Z_l); the ratio to 'linear' at the same (L, T) is
  printed.
* mc: the Monte Carlo saddle point of deep tanh networks (dmftc.runtime.march.deep_dmft.solve_deep): one
  causal march with forward-mode response tangents, O(samples L T^3) work.

Every case runs in a fresh subprocess so that its peak resident memory is its own; each
prints the first call (with JAX tracing/compilation) and a second, steady-state call.  ``--against DIR`` also
runs every case with another checkout of dmftc first on the path (e.g. a ``git worktree`` of an older commit),
right after it, and prints the ratio of the steady-state times.
"""
from __future__ import annotations

import argparse
import json

from checkouts import run_case

CASE = r"""
import json, resource, time
import numpy as np
from dmftc.deep import solve_deep
kw = json.loads({kw!r})
out = {{}}
for run in ("first", "second"):
    t0 = time.perf_counter()
    sol = solve_deep(**kw)
    out[run] = time.perf_counter() - t0
out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
out["n_vars"] = sol.info.get("n_vars")
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", nargs="+", default=["linear", "mc"], choices=["linear", "linear_m1", "mc"])
    ap.add_argument("--T", type=int, nargs="+", default=[10, 20, 30])
    ap.add_argument("--L", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--against", default=None, help="another dmftc checkout to time as the reference")
    args = ap.parse_args()
    print(f"{'backend':<10}{'L':>3}{'T':>5}{'vars':>8}{'first s':>10}{'second s':>10}{'peak MB':>10}")
    seconds = {}
    for what in args.what:
        prev = {}
        for L in args.L:
            for T in args.T:
                kw = dict(activation="tanh" if what == "mc" else "linear", L=L, T=T, gamma=1.0, y=1.0,
                          eta=0.05)
                if what == "linear_m1":
                    kw["correction"] = True
                if what == "mc":
                    kw["samples"] = args.samples
                r = run_case(CASE.format(kw=json.dumps(kw)))
                if "error" in r:
                    print(f"{what:<10}{L:>3}{T:>5}  {r['error']}")
                    continue
                ratio = ""
                if L in prev:
                    T0, s0 = prev[L]
                    ratio = f"  x{r['second'] / s0:.1f} for T x{T / T0:.1f}"
                prev[L] = (T, r["second"])
                seconds[(what, L, T)] = r["second"]
                if what == "linear_m1" and ("linear", L, T) in seconds:
                    ratio += f"  ({r['second'] / seconds[('linear', L, T)]:.2f} x the propagator alone)"
                nv = r.get("n_vars") or "-"
                print(f"{what:<10}{L:>3}{T:>5}{nv:>8}{r['first']:>10.2f}{r['second']:>10.2f}{r['peak_mb']:>10.0f}{ratio}")
                if args.against:
                    ref = run_case(CASE.format(kw=json.dumps(kw)), args.against)
                    if "error" in ref:
                        print(f"  reference ({args.against}): {ref['error']}")
                    else:
                        print(f"  reference: first {ref['first']:.2f} s, second {ref['second']:.2f} s, peak "
                              f"{ref['peak_mb']:.0f} MB; ratio {r['second'] / ref['second']:.2f}")


if __name__ == "__main__":
    main()
