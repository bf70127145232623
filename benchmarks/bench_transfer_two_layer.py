"""Benchmark: the tangent pass of two_layer (dF/dDelta over all T driving directions) three ways on the same paths,
in one process: the site engine's tangent march (tangents='march'), its per-path transfer matrices (the default,
dmftc.runtime.sensitivities.site_transfer) and the hand-written NumPy transfer form (dmftc.reference.transfer_two_layer).

Run: python benchmarks/bench_transfer_two_layer.py [--T 250] [--samples 10000 100000] [--gamma 1.5]
Prints, per number of paths, the steady-state time of each (the engine's two include its replay of the paths),
the march's time over the engine's transfer form, the largest differences relative to the largest entry, and the
time of one 1000 x 1000 matmul measured in the same process.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=250)
    ap.add_argument("--samples", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--gamma", type=float, default=1.5)
    args = ap.parse_args()

    import jax.numpy as jnp

    import dmftc
    from dmftc.reference.transfer_two_layer import delta_jacobian
    from dmftc.runtime.engines import site_engine as se

    mod = dmftc.load(ROOT / "specs" / "two_layer.dmft").module
    T, gamma, kx, eta = args.T, args.gamma, 0.5, 0.02
    p = {"gamma": gamma, "kx": kx, "y": -0.8, "eta": eta}
    a, b = np.random.default_rng(0).normal(size=(2, 1000, 1000))
    t0 = time.perf_counter()
    a @ b
    print(f"T = {T}, gamma = {gamma}; one 1000 x 1000 matmul {1e3 * (time.perf_counter() - t0):.1f} ms")
    print(f"{'paths':>8} {'march s':>8} {'transfer s':>11} {'numpy s':>8} {'march/transfer':>15} "
          f"{'diff transfer':>14} {'diff numpy':>11}")
    for S in args.samples:
        rng = np.random.default_rng(S)
        uu = rng.multivariate_normal([0.0, 0.0], [[1.0, kx], [kx, 1.0]], size=S)
        rr = rng.normal(size=(S, 1))
        normals, _, pj, width = se._setup(mod, [uu, rr], p, {})
        wts = jnp.full(S, 1.0 / S)
        q = se.group_saddle(mod, normals, wts, pj, {}, T, width)
        Delta = np.asarray(q["Delta"]).reshape(T)
        times = {}
        for _ in range(2):                                   # the second call: steady state
            J = {}
            for how in ("march", "transfer"):
                t0 = time.perf_counter()
                J[how] = se.group_sensitivities(mod, normals, wts, pj, q, {}, T, width, tangents=how)[0]
                times[how] = time.perf_counter() - t0
            t0 = time.perf_counter()
            G = delta_jacobian(uu[:, 0], uu[:, 1], rr[:, 0], Delta, gamma=gamma, kx=kx, eta=eta)
            times["numpy"] = time.perf_counter() - t0
        scale = np.abs(J["march"]).max()
        diff = np.abs(J["transfer"] - J["march"]).max() / scale
        ref = np.stack([J["march"].reshape(T, 4, T, 4)[:, k, :, 0] for k in range(4)])
        diff_np = np.abs(G - ref).max() / scale
        print(f"{S:>8} {times['march']:>8.2f} {times['transfer']:>11.2f} {times['numpy']:>8.2f} "
              f"{times['march'] / times['transfer']:>15.1f} {diff:>14.1e} {diff_np:>11.1e}")


if __name__ == "__main__":
    main()
