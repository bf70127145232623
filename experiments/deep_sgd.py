"""Deep networks trained by SGD with momentum, weight decay and a schedule (spec deep_sgd) against optax networks.

The spec ``specs/deep_sgd.dmft`` (a deep tanh network with L hidden layers, one training point) is solved at
several settings of the optimiser

    optax.chain(optax.add_decayed_weights(lam / (N gamma^2)),
                optax.sgd(learning_rate=lambda t: eta N gamma^2 lr[t], momentum=beta))

(means from the spec's march, N Var from the Monte Carlo propagator) and compared with ensembles of width-N
networks trained by that optimiser in optax itself (dmftc.validation.optax_truth), Richardson-extrapolated in 1/N
from widths N and 2N.  The settings, chosen before looking at the results, cover plain gradient descent, momentum
0.5, 0.7 and 0.9, weight decay 0, 0.05 and 0.1, a constant step, a linear decay to 0.5 and a warm-up + cosine
schedule from optax.schedules ending at 0.1, two and three hidden layers, rich (gamma >= 1) and lazier
(gamma = 0.3) training, and targets of both signs.

Panels per setting (rows): <Delta(t)>, N Var Delta(t), <K(t)>, N Var K(t), N Var Phi[L](t, t),
N Var G[1](t, t); the spec's solution dashed with a band of 2 standard errors, the extrapolated networks as points
with 2 se bars.

Agreement (asserted): pointwise z = |theory - networks| / sqrt(se_theory^2 + se_networks^2) <= 4 for the means
and N Var of Delta, K and every layer's Phi[l](t, t), G[l](t, t); in full mode also max_t |theory - networks|
within 1% of the peak for the means and within 5% of the peak for N Var.

    python experiments/deep_sgd.py [--quick] [--out DIR] [--E E] [--samples S]

--samples sets the propagator's paths (the means march 2048000 paths, 32000 in quick mode).  Timings:
experiments/README.md.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.optax_nets import optax_truth  # noqa: E402

SEED, REL_MEAN, REL_NVAR = 1100, 0.01, 0.05
# label -> network and optimiser; lr: common.schedule
SETTINGS = {
    "GD": dict(L=2, beta=0.0, lam=0.0, lr="constant", gamma=1.0, y=1.0, eta=0.1),
    "beta=0.5, linear": dict(L=2, beta=0.5, lam=0.0, lr="linear", gamma=1.2, y=-1.0, eta=0.1),
    "beta=0.9, lam=0.05, cosine": dict(L=2, beta=0.9, lam=0.05, lr="cosine", gamma=1.5, y=0.8, eta=0.1),
    "beta=0.7, lam=0.1, cosine, L=3": dict(L=3, beta=0.7, lam=0.1, lr="cosine", gamma=1.0, y=-0.6, eta=0.1),
    "beta=0.9, lam=0.05, cosine, lazier": dict(L=2, beta=0.9, lam=0.05, lr="cosine", gamma=0.3, y=1.0, eta=0.1),
}
QUICK = ("beta=0.5, linear", "beta=0.7, lam=0.1, cosine, L=3")


def names(L: int) -> tuple:
    return ("Delta", "K", *(f"Phi[{l}]" for l in range(1, L + 1)), *(f"G[{l}]" for l in range(1, L + 1)))


def diagonal(a):
    """The time diagonal of a two-time mean (one-time quantities as they are)."""
    a = np.asarray(a)
    return a if a.ndim == 1 else np.diagonal(a, axis1=-2, axis2=-1)


def main():
    args = common.parse_args("deep_sgd", __doc__, common.ensemble_options)
    # the means' paths: at 8 x 32000 their standard error was 0.4-0.6% of the peak of <G[1]> (G = <g g> has a wide
    # path distribution), too coarse for the 1% bound; 2048000 paths in 64 groups bring it to 0.25%
    if args.quick:
        T, N, E, paths, groups, mean_paths, labels = 6, 64, 4000, 4000, 4, 32000, QUICK
    else:
        T, N, E, paths, groups, mean_paths, labels = 16, 64, 64000, 32000, 8, 2048000, tuple(SETTINGS)
    E, paths = args.E or E, args.samples or paths
    agree = common.Agreement("deep_sgd", args.quick)
    agree.meta.update(T=T, widths=[N, 2 * N], E=E, propagator_paths=paths, mean_paths=mean_paths,
                      settings={k: SETTINGS[k] for k in labels}, rel_mean=REL_MEAN, rel_nvar=REL_NVAR)
    model = dmftc.load(common.SPECS / "deep_sgd.dmft")
    arrays, curves = {}, {}
    for k, label in enumerate(labels):
        s = dict(SETTINGS[label])
        lr = common.schedule(s.pop("lr"), T)
        sol = model.solve(T=T, lr=lr, samples=mean_paths, groups=max(16, mean_paths // 32000),
                          propagator_samples=paths, propagator_groups=groups, seed=SEED + 10 * k, progress=False, **s)
        nets = optax_truth(activation="tanh", T=T, N=N, E=E, lr=lr, seed=SEED + 10 * k + 1, **s)
        for n in names(s["L"]):
            th = {"mean": (diagonal(sol.mean(n)), diagonal(sol.mean_stderr(n))),
                  "nvar": (sol.var(n), sol.var_stderr(n))}
            ens = {"mean": (nets.mean[n], nets.mean_se[n]), "nvar": (nets.nvar[n], nets.nvar_se[n])}
            common.add_mean_nvar(agree, label, n, th, ens, curves, arrays)
        arrays[f"{label}_lr"] = lr
    times = np.arange(T)
    np.savez_compressed(args.out / "deep_sgd.npz", steps=times, **arrays)

    plt = common.pyplot()
    fig, axes = plt.subplots(len(labels), 6, figsize=(19, 2.6 * len(labels)), squeeze=False)
    for i, label in enumerate(labels):
        s = SETTINGS[label]
        L = s["L"]
        panels = [("Delta", "mean", r"$\langle\Delta\rangle$"), ("Delta", "nvar", r"$N\,\mathrm{Var}\,\Delta$"),
                  ("K", "mean", r"$\langle K\rangle$"), ("K", "nvar", r"$N\,\mathrm{Var}\,K$"),
                  (f"Phi[{L}]", "nvar", rf"$N\,\mathrm{{Var}}\,\Phi^{{{L}}}(t,t)$"),
                  ("G[1]", "nvar", r"$N\,\mathrm{Var}\,G^{1}(t,t)$")]
        for j, (ax, (n, what, sym)) in enumerate(zip(axes[i], panels)):
            th, th_se, ens, ens_se = curves[(label, n, what)]
            ax.fill_between(times, th - 2 * th_se, th + 2 * th_se, color="0.6", alpha=0.35, lw=0)
            ax.plot(times, th, **common.THEORY)
            ax.errorbar(times, ens, yerr=2 * ens_se, fmt="o", ms=2.5, color=f"C{j}", lw=0.8)
            ax.set_ylabel(sym)
            if i == len(labels) - 1:
                ax.set_xlabel("step t")
            if j == 0:
                ax.set_title(f"{label}: L = {L}, gamma = {s['gamma']:g}, y = {s['y']:g}, eta = {s['eta']:g}",
                             loc="left", fontsize=8.5)
    fig.suptitle(f"deep_sgd.dmft vs optax-trained networks (E = {E} per width; points: extrapolated from "
                 f"N = {N} and {2 * N}, 2 se bars) and the spec's solution ({paths} propagator paths; dashed, "
                 "band 2 se)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.975))
    common.save_figure(fig, args.out, "deep_sgd")
    common.finish_bounds(agree, args.out, REL_MEAN, REL_NVAR)


if __name__ == "__main__":
    main()
