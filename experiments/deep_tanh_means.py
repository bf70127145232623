"""Deep tanh network (L = 2 hidden layers), one training point: infinite-width means against finite-width networks.

Panels: (a) <Delta(t)>, (b) <K(t)>, (c) <Phi[l](t,t)>, (d) <G[l](t,t)>, l = 1, 2.  Dashed black: the Monte Carlo
saddle point of the exact discrete-time DMFT (dmftc.deep.solve_deep, many source paths, so its error is small).
Solid with a band (+- 2 standard errors): ensembles of width-N tanh networks trained by discrete gradient
descent (dmftc.validation.deep_ensemble), Richardson-extrapolated from widths N and 2N (removes the O(1/N) bias).

Agreement (asserted): pointwise z <= 4 (combined standard errors) and, in full mode, max_t |DMFT - ensemble| at
most 2% of each curve's peak (the issue's "means within 2%").  The variances of the same network are in
deep_tanh_variance.py.

    python experiments/deep_tanh_means.py [--quick] [--out DIR]

Full mode (T = 40, eta = 0.05, 2e5 source paths, E = 16000 networks per width) takes about 4 minutes on 2 cores.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # the simulator runs its own 2 threads

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dmftc.deep import solve_deep  # noqa: E402
from dmftc.validation.deep_ensemble import simulate_deep  # noqa: E402

L, GAMMA, Y, SEED, REL_MAX = 2, 1.0, 1.0, 900, 0.02


def main():
    args = common.parse_args("deep_tanh_means", __doc__)
    if args.quick:
        T, eta, samples, groups, N, E = 8, 0.1, 64000, 16, 256, 2000
    else:
        T, eta, samples, groups, N, E = 40, 0.05, 200000, 16, 256, 16000
    agree = common.Agreement("deep_tanh_means", args.quick)
    agree.meta.update(L=L, gamma=GAMMA, y=Y, T=T, eta=eta, samples=samples, groups=groups, widths=[N, 2 * N], E=E,
                      rel_max_allowed=None if args.quick else REL_MAX)
    names = ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    times = eta * np.arange(T)
    kw = dict(activation="tanh", L=L, gamma=GAMMA, y=Y, eta=eta, T=T)
    sol = solve_deep(samples=samples, groups=groups, seed=SEED, **kw)
    raw = simulate_deep(N=N, E=E, seed=SEED + 1, **kw)
    big = simulate_deep(N=2 * N, E=E, seed=SEED + 2, **kw)
    diag = lambda a: a if a.ndim == 1 else np.diag(a)  # noqa: E731
    arrays, curves = {}, {}
    for n in names:
        th, th_se = diag(sol.mean(n)), diag(sol.mean_stderr(n))
        m, m_se = common.richardson(diag(raw.mean[n]), diag(raw.se_mean[n]), diag(big.mean[n]), diag(big.se_mean[n]))
        agree.add(f"<{n}>", th, th_se, m, m_se, raw=diag(big.mean[n]))
        curves[n] = (th, m, m_se)
        arrays.update({f"dmft_{n}": th, f"dmft_se_{n}": th_se, f"extrap_{n}": m, f"extrap_se_{n}": m_se,
                       f"ens_{n}": diag(raw.mean[n]), f"ens2_{n}": diag(big.mean[n])})
    np.savez_compressed(args.out / "deep_tanh_means.npz", times=times, **arrays)

    plt = common.pyplot()
    fig, axes, panels, colors = common.deep_panels(plt, L)
    for ax, group in zip(axes, panels):
        for c, n in zip(colors if len(group) > 1 else ["tab:blue"], group):
            th, m, m_se = curves[n]
            ax.fill_between(times, m - 2 * m_se, m + 2 * m_se, color=c, alpha=0.3, lw=0)
            ax.plot(times, m, color=c, lw=2.2, alpha=0.85, label="extrapolated" if len(group) == 1 else n)
            ax.plot(times, th, **common.THEORY)
    common.label_deep_panels(axes, "mean")
    common.finish_row_figure(plt, fig, axes[0], f"Deep tanh network (L = {L}), one point: width {N}/{2 * N} "
                             f"ensembles (E = {E}, extrapolated, band 2 se) vs infinite-width DMFT (dashed)",
                             args.out, "deep_tanh_means")
    too_far = {k: r["rel_max"] for k, r in agree.rows.items() if not args.quick and r["rel_max"] > REL_MAX}
    agree.finish(args.out, max_rel_means=max(r["rel_max"] for r in agree.rows.values()))
    if too_far:
        sys.exit("FAILED: deep_tanh_means: means differ by more than 2% of their peak: "
                 + ", ".join(f"{k} {v:.3f}" for k, v in too_far.items()))


if __name__ == "__main__":
    main()
