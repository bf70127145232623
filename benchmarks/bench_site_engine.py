"""Benchmark: a two-layer spec's propagator through its single-site program (dmftc.runtime.engines.site_engine) against
the two-layer engine (dmftc.reference.two_layer_engine), on the same source draws, one group of paths.

Run: python benchmarks/bench_site_engine.py [--samples 1000] [--repeat 2]
For each case prints the wall-clock time of both engines (the first call compiles, the last is steady state),
the ratio site / two-layer of the steady-state times, measured in the same run, and the largest difference of
the propagators relative to their peak (the engines compute the same number: round-off).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent

CASES = (("two_layer", dict(T=60)), ("two_layer_multi", dict(T=100, P=4)), ("linear_whitened", dict(T=100, P=4)))


def draws_for(mod, p, sz, S, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((S, np.shape(c)[0])) @ np.linalg.cholesky(np.asarray(c, dtype=float)).T
            for c in mod.source_covariances(p, sz)]


def two_layer_sigma(mod, draws, params):
    """One group of the two-layer engine's Monte Carlo solve on these draws (its jitted march and passes)."""
    from dmftc.reference import two_layer_engine as engine
    from dmftc.reference.two_layer_kernels import place_sources
    from dmftc.runtime.numerics.geometry import Geometry
    from dmftc.runtime.problem.params import resolve_params

    p, sz, T = resolve_params(mod, params, dirac_width=0.0)
    geo = Geometry(mod, sz)
    S = place_sources(mod, [jnp.asarray(x) for x in draws])
    pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
    march = engine._compiled("saddle", mod, geo, T, lambda S, p: engine._saddle_march(mod, geo, S, p, geo.sz, T))
    q, Rq, avg = march(S, pj)
    kappa, D = engine._moments(mod, geo, S, q, avg, pj, sz, T, len(draws[0]))
    U0 = engine.explicit_jacobian(mod, geo, {k: np.asarray(v) for k, v in q.items()},
                                  {k: np.asarray(v) for k, v in Rq.items()}, p, sz, T)
    return engine.propagator(U0, kappa, D, geo, T)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    import dmftc
    from dmftc.reference.two_layer_kernels import load as reference_module
    from dmftc.runtime.problem.params import resolve_params
    from dmftc.runtime.engines.site_engine import two_layer_propagator

    print(f"{'spec':<18}{'params':<16}{'site first':>11}{'site':>8}{'2-layer first':>14}{'2-layer':>9}"
          f"{'ratio':>7}{'max |diff| / peak':>19}")
    for name, params in CASES:
        mod = dmftc.load(ROOT / "specs" / f"{name}.dmft").module
        ref = reference_module(ROOT / "specs" / f"{name}.dmft")
        p, sz, T = resolve_params(mod, params, dirac_width=0.0)
        draws = draws_for(mod, p, sz, args.samples)
        times = {"site": [], "two": []}
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            got = two_layer_propagator(mod, draws, p, sz, T)["sigma"]
            t1 = time.perf_counter()
            want = two_layer_sigma(ref, draws, params)
            t2 = time.perf_counter()
            times["site"].append(t1 - t0)
            times["two"].append(t2 - t1)
        diff = np.abs(got - want).max() / np.abs(want).max()
        text = ",".join(f"{k}={v}" for k, v in params.items())
        print(f"{name:<18}{text:<16}{times['site'][0]:>10.2f}s{times['site'][-1]:>7.2f}s{times['two'][0]:>13.2f}s"
              f"{times['two'][-1]:>8.2f}s{times['site'][-1] / times['two'][-1]:>7.2f}{diff:>19.1e}")


if __name__ == "__main__":
    main()
