"""A deep network trained on several points: the infinite-width means of specs/deep_multi.dmft against networks.

The spec is the deep tanh network written with a point index (``index mu, nu in 1..P``), which dmftc folds into
time; here P = 4 points of a random Gram matrix (inputs in D = 8 dimensions) with targets of both signs,
L = 2 hidden layers, gamma = 1.2.  Ground truth: depth-L networks trained on the same points by gradient descent
(dmftc.validation.deep_ensemble.simulate_deep with Kx, y), Richardson-extrapolated in 1/N from widths N and 2N.
Panels: the error signal Delta_mu(t) of every point, the NTK K_{mu nu}(t) and the equal-time kernels
Phi[2]_{mu nu}(t, t), G[1]_{mu nu}(t, t) of every pair (theory dashed with a 2 se band, networks as points).

Agreement (asserted): pointwise z <= 4 for Delta, K, Phi[l](t, t), G[l](t, t) of every point and pair; in full
mode also within 2% of each quantity's peak.

    python experiments/deep_points.py [--quick] [--out DIR]

Full mode (T = 20, eta = 0.05; 64000 source paths in 16 groups; N = 256 and 512, E = 3000 networks per width)
takes about 8 minutes on 2 cores; the quick mode (T = 6, eta = 0.1, N = 128/256, E = 1500; about 15 s) runs with
``-m slow`` (tests/test_experiments.py); the default suite makes the same comparison in
tests/test_deep_points.py::test_means_on_points_match_networks.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # the simulator runs its own 2 threads

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.deep_ensemble import simulate_deep  # noqa: E402

L, P, GAMMA, SEED, REL_MAX = 2, 4, 1.2, 1400, 0.02


def main():
    args = common.parse_args("deep_points", __doc__)
    if args.quick:
        T, eta, samples, N, E = 6, 0.1, 8000, 128, 1500
    else:
        T, eta, samples, N, E = 20, 0.05, 64000, 256, 3000
    rng = np.random.default_rng(SEED)
    Z = rng.standard_normal((P, 8))
    Kx, y = Z @ Z.T / 8, np.array([0.9, -0.6, 0.4, -1.0])
    agree = common.Agreement("deep_points", args.quick)
    agree.meta.update(L=L, P=P, T=T, eta=eta, gamma=GAMMA, samples=samples, widths=[N, 2 * N], E=E,
                      Kx=Kx.tolist(), y=y.tolist())
    kw = dict(L=L, gamma=GAMMA, y=y, eta=eta, T=T, Kx=Kx)
    sol = dmftc.load(common.SPECS / "deep_multi.dmft", args.out).solve(P=P, samples=samples, groups=16,
                                                                       seed=SEED, **kw)
    raw = simulate_deep(activation="tanh", N=N, E=E, seed=SEED + 1, **kw)
    big = simulate_deep(activation="tanh", N=2 * N, E=E, seed=SEED + 2, **kw)
    names = ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]
    same = lambda x: np.einsum("mntt->mnt", x) if x.ndim == 4 else x      # noqa: E731
    curves, arrays = {}, {}
    for n in names:
        th, th_se = same(sol.mean(n)), same(sol.mean_stderr(n))
        ens, ens_se = common.richardson(raw.mean[n], raw.se_mean[n], big.mean[n], big.se_mean[n])
        ens, ens_se = same(ens), same(ens_se)
        agree.add(f"mean {n}", th, th_se, ens, ens_se, raw=same(raw.mean[n]))
        curves[n] = (th, th_se, ens, ens_se)
        arrays.update({f"theory:{n}": th, f"theory_se:{n}": th_se, f"ensemble:{n}": ens, f"ensemble_se:{n}": ens_se})
    times = eta * np.arange(T)
    np.savez_compressed(args.out / "deep_points.npz", times=times, **arrays)

    plt = common.pyplot()
    shown = ["Delta", "K", "Phi[2]", "G[1]"]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.0 * len(shown), 3.6))
    common.point_panels(axes, times, {n: curves[n] for n in shown})
    fig.suptitle(f"deep tanh network (L = {L}) on P = {P} points: theory (dashed, 2 se) against networks "
                 f"(points, N = {N}/{2 * N} extrapolated, E = {E})", fontsize=9)
    common.save_figure(fig, args.out, "deep_points")
    if not args.quick:
        worst = max(r["rel_max"] for r in agree.rows.values())
        agree.meta["max_rel_of_peak"] = worst
        if worst > REL_MAX:
            agree.finish(args.out)
            sys.exit(f"FAILED: deep_points: a mean is {100 * worst:.1f}% of its peak off (> {100 * REL_MAX:.0f}%)")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
