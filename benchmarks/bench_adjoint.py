"""Benchmark: the adjoint propagator (prototype, dmftc.runtime.adjoint) against the MSR-Hessian deep propagator
(dmftc.runtime.engines.deep_propagator), measured in one run: warm solve times (a first call of each compiles), their
ratio, and the largest standard error of each N Var relative to its peak (the MSR route's peak), per T.

    python benchmarks/bench_adjoint.py [--L 2] [--paths 2000] [--groups 4] [--T 5 10 15] [--activation tanh]

Both estimate the same propagator with different estimators of the source-covariance derivatives (pathwise
through the Cholesky factors, against Price's theorem); docs/how-it-works.md, "The adjoint propagator".
"""
import argparse
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

from dmftc.runtime.adjoint.propagator import adjoint_propagator  # noqa: E402
from dmftc.runtime.engines.deep_propagator import deep_propagator  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--L", type=int, default=2)
    ap.add_argument("--paths", type=int, default=2000)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--T", type=int, nargs="+", default=[5, 10, 15])
    ap.add_argument("--activation", default="tanh")
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--eta", type=float, default=0.05)
    args = ap.parse_args()
    print(f"deep {args.activation}, L = {args.L}, gamma = {args.gamma}, eta = {args.eta}, {args.paths} paths in "
          f"{args.groups} groups; warm times (seed 1 after a compiling call with seed 0)")
    print(f"{'T':>4} {'adjoint s':>10} {'MSR s':>8} {'ratio':>6}  worst se / peak of N Var: adjoint | MSR")
    for T in args.T:
        kw = dict(L=args.L, T=T, activation=args.activation, gamma=args.gamma, y=1.0, eta=args.eta)
        adjoint_propagator(paths=args.paths, groups=args.groups, **kw)
        t0 = time.perf_counter()
        A = adjoint_propagator(paths=args.paths, groups=args.groups, seed=1, **kw)
        ta = time.perf_counter() - t0
        deep_propagator(samples=args.paths, groups=args.groups, **kw)
        t0 = time.perf_counter()
        D = deep_propagator(samples=args.paths, groups=args.groups, seed=1, **kw)
        td = time.perf_counter() - t0
        rel_a = {n: float(A.var_se(n).max() / np.abs(D.var(n)).max()) for n in A.names}
        rel_d = {n: float(D.se_var(n).max() / np.abs(D.var(n)).max()) for n in A.names}
        wa, wd = max(rel_a, key=rel_a.get), max(rel_d, key=rel_d.get)
        print(f"{T:>4} {ta:>10.2f} {td:>8.2f} {ta / td:>6.1f}  {rel_a[wa]:.1%} ({wa}) | {rel_d[wd]:.1%} ({wd})",
              flush=True)


if __name__ == "__main__":
    main()
