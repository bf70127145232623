"""Benchmark: finite-width propagator of deep tanh networks -- time and peak memory against T, L and samples.

Run: python benchmarks/bench_deep_propagator.py [--T 10 20 30 40 50] [--L 2 3] [--samples 1000] [--groups 2]
         [--activation tanh] [--against DIR]

``--against DIR`` also runs every case with another checkout of dmftc first on the path (e.g. a
``git worktree`` of an older commit) and prints the ratio of this tree's time to that reference's, measured
in the same run.  The times include JAX compilation, and the persistent compilation cache serves a program
compiled by one tree to the other when both compile the same one: on an empty cache the first of the two pays
for both (seen: ratios 0.68 and 0.80 for two identical numerical paths, 1.06 and 1.04 when run again), so
compare ratios of a second run, or of trees whose programs differ.

Each case (dmftc.runtime.engines.deep_propagator.deep_propagator, one training point, gamma = 1, eta = 0.05) runs in a fresh
subprocess so that its peak resident memory is its own, and prints the split of the wall time:

* saddle   the Monte Carlo march of every group (O(S L T^3));
* hessian  per layer, per-path derivatives summed over paths (dmftc.runtime.sensitivities.site_moments): first and
           second source derivatives O(S T^4), the Price block of the couplings O(S T^5) (matrix products
           over paths and blocks of times, bounded by causality: about T^5 / 3 multiply-adds per path and
           source block), the features' covariance of the extra feature paths marched at the saddle (15 per
           derivative path by default, O(T^4) each: dmftc.runtime.sensitivities.held_paths), then the chain rule
           and the assembly of U and Kd (O(L^2 T^4) per group);
* solve    causal block back substitution with the dual-primal block U (dmftc.runtime.solvers.causal_solve),
           n = L T(T+1) + (L-1) T^2 + T primal variables, for the R = (2 L + 2) T time-diagonal
           observables: O(R n^2) = O(L^3 T^5) time, O(n^2) = O(L^2 T^4) memory.

With P training points every time index becomes a (time, point) index: T -> T P in these counts (a deep spec
on several points, dmftc.runtime.engines.deep_points, runs this propagator over its T P steps; measured: L = 2, T = 8,
P = 3, 8000 paths in 8 groups, 98 s on 2 cores).
Ratios to the previous T (same L) show the empirical exponent.
"""
from __future__ import annotations

import argparse
import json
import math

from checkouts import run_case

CASE = r"""
import json, resource, time
try:
    from dmftc.runtime.engines.deep_propagator import deep_propagator
    from dmftc.runtime.problem.deep_action import Layout
except ImportError:                   # a checkout from before the runtime's sub-packages (--against)
    from dmftc.runtime.deep_propagator import deep_propagator
    from dmftc.runtime.deep_action import Layout
kw = json.loads({kw!r})
t0 = time.perf_counter()
P = deep_propagator(gamma=1.0, y=1.0, eta=0.05, **kw)
d = P.diagnostics
out = dict(total=time.perf_counter() - t0, saddle=d["time_saddle"], hessian=d["time_hessian"],
           solve=d["time_solve"], n_vars=Layout(kw["L"], kw["T"]).n // 2, stationarity=d["stationarity"],
           peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
           var_delta_end=float(P.var("Delta")[-1]), se_var_delta_end=float(P.se_var("Delta")[-1]),
           var_k_end=float(P.var("K")[-1]), se_var_k_end=float(P.se_var("K")[-1]))
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[10, 20, 30, 40, 50])
    ap.add_argument("--L", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--samples", type=int, default=1000, help="source paths in all (split into groups)")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--activation", default="tanh", help="an expression in h or a shorthand")
    ap.add_argument("--against", default=None, help="another dmftc checkout to time as the reference")
    args = ap.parse_args()
    print(f"samples = {args.samples} in {args.groups} groups; times in s (first call, includes JAX compilation)")
    print(f"{'L':>2}{'T':>4}{'n':>7}{'total':>9}{'saddle':>8}{'hessian':>9}{'solve':>8}{'peak MB':>9}"
          f"{'x prev':>8}{'exp':>6}   N Var Delta(T) +- se    N Var K(T) +- se")
    for L in args.L:
        prev = None
        for T in args.T:
            kw = dict(L=L, T=T, samples=args.samples, groups=args.groups, activation=args.activation)
            ref = run_case(CASE.format(kw=json.dumps(kw)), args.against) if args.against else None
            r = run_case(CASE.format(kw=json.dumps(kw)))
            if "error" in r:
                print(f"{L:>2}{T:>4}  failed: {r['error']}")
                continue
            ratio = exp = ""
            if prev is not None:
                x = r["total"] / prev[1]
                ratio, exp = f"{x:8.2f}", f"{math.log(x) / math.log(T / prev[0]):6.2f}"
            print(f"{L:>2}{T:>4}{r['n_vars']:>7}{r['total']:>9.1f}{r['saddle']:>8.1f}{r['hessian']:>9.1f}"
                  f"{r['solve']:>8.1f}{r['peak_mb']:>9.0f}{ratio:>8}{exp:>6}   "
                  f"{r['var_delta_end']:.4g} +- {r['se_var_delta_end']:.2g}    {r['var_k_end']:.4g} +- {r['se_var_k_end']:.2g}",
                  flush=True)
            if ref is not None:
                if "error" in ref:
                    print(f"      reference failed: {ref['error']}")
                else:
                    print(f"      reference ({args.against}): total {ref['total']:.1f} s, hessian {ref['hessian']:.1f} s;"
                          f" this tree / reference = {r['total'] / ref['total']:.2f} (same N Var Delta(T): "
                          f"{abs(ref['var_delta_end'] - r['var_delta_end']) < 1e-9 * max(1.0, abs(r['var_delta_end']))})",
                          flush=True)
            prev = (T, r["total"])


if __name__ == "__main__":
    main()
