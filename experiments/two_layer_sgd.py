"""SGD with momentum, weight decay and a schedule (spec two_layer_sgd) against networks trained by optax.

The spec ``specs/two_layer_sgd.dmft`` (two-layer tanh network, one training point) is solved by the Monte Carlo
backend at several settings of the optimiser

    optax.chain(optax.add_decayed_weights(lam / (N gamma^2)),
                optax.sgd(learning_rate=lambda t: eta N gamma^2 lr[t], momentum=beta))

and compared with ensembles of width-N networks trained by that optimiser in optax itself
(dmftc.validation.optax_truth), Richardson-extrapolated in 1/N from widths N and 2N.  The settings, chosen before
looking at the results, cover plain gradient descent (beta = 0), momentum 0.5 and 0.9, weight decay 0 and 0.1,
a constant step and a warm-up + cosine schedule from optax.schedules ending at 0.1, rich (gamma >= 1) and lazy
(gamma = 0.1) training, and targets of both signs.

Panels per setting (rows): <Delta(t)>, N Var Delta(t), <K(t)>, N Var K(t); the spec's solution dashed with a
band of 2 standard errors, the extrapolated networks as points with 2 se bars.

Agreement (asserted): pointwise z = |theory - networks| / sqrt(se_theory^2 + se_networks^2) <= 4 for the means
and N Var of Delta and K; in full mode also max_t |theory - networks| within 1% of the peak for the means and
within 5% of the peak for N Var.

    python experiments/two_layer_sgd.py [--quick] [--out DIR] [--E E] [--samples S]

Full mode (T = 30, N = 64 and 128, E = 200000 networks per width, 400000 paths) took 7 and 14.5 minutes (two runs) on 2
cores shared with other jobs; --quick (T = 10, N = 32 and 64, E = 6000, three settings) about 15 s.
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

SEED, REL_MEAN, REL_NVAR = 700, 0.01, 0.05
NAMES = ("Delta", "K")
# label -> optimiser and network; "cosine": optax.schedules.warmup_cosine_decay_schedule (warm-up to 1, end 0.1)
SETTINGS = {
    "GD": dict(beta=0.0, lam=0.0, lr="constant", gamma=1.0, y=1.0, eta=0.2),
    "beta=0.5": dict(beta=0.5, lam=0.0, lr="constant", gamma=1.5, y=-1.0, eta=0.2),
    "beta=0.5, lam=0.1, cosine": dict(beta=0.5, lam=0.1, lr="cosine", gamma=1.2, y=-1.0, eta=0.3),
    "beta=0.9, lam=0.1, cosine": dict(beta=0.9, lam=0.1, lr="cosine", gamma=2.0, y=0.8, eta=0.1),
    "beta=0.9, lam=0.1, cosine, lazy": dict(beta=0.9, lam=0.1, lr="cosine", gamma=0.1, y=1.0, eta=0.1),
}
QUICK = ("GD", "beta=0.5, lam=0.1, cosine", "beta=0.9, lam=0.1, cosine, lazy")


def main():
    args = common.parse_args("two_layer_sgd", __doc__, common.ensemble_options)
    if args.quick:
        T, N, E, samples, labels = 10, 32, 6000, 20000, QUICK
    else:
        T, N, E, samples, labels = 30, 64, 200000, 400000, tuple(SETTINGS)
    E, samples = args.E or E, args.samples or samples
    agree = common.Agreement("two_layer_sgd", args.quick)
    agree.meta.update(T=T, widths=[N, 2 * N], E=E, samples=samples, settings={k: SETTINGS[k] for k in labels},
                      rel_mean=REL_MEAN, rel_nvar=REL_NVAR)
    model = dmftc.load(common.SPECS / "two_layer_sgd.dmft")
    arrays, curves = {}, {}
    for k, label in enumerate(labels):
        s = dict(SETTINGS[label])
        lr = common.schedule(s.pop("lr"), T)
        sol = model.solve(T=T, lr=lr, backend="mc", samples=samples, seed=SEED + 10 * k, progress=False, **s)
        nets = optax_truth(T=T, N=N, E=E, lr=lr, seed=SEED + 10 * k + 1, **s)
        for n in NAMES:
            th = {"mean": (sol.mean(n), sol.mean_stderr(n)), "nvar": (sol.var(n), sol.var_stderr(n))}
            ens = {"mean": (nets.mean[n], nets.mean_se[n]), "nvar": (nets.nvar[n], nets.nvar_se[n])}
            common.add_mean_nvar(agree, label, n, th, ens, curves, arrays)
        arrays[f"{label}_lr"] = lr
    times = np.arange(T)
    np.savez_compressed(args.out / "two_layer_sgd.npz", steps=times, **arrays)

    plt = common.pyplot()
    fig, axes = plt.subplots(len(labels), 4, figsize=(14, 2.6 * len(labels)), squeeze=False)
    panels = [("Delta", "mean", r"$\langle\Delta\rangle$"), ("Delta", "nvar", r"$N\,\mathrm{Var}\,\Delta$"),
              ("K", "mean", r"$\langle K\rangle$"), ("K", "nvar", r"$N\,\mathrm{Var}\,K$")]
    for i, label in enumerate(labels):
        s = SETTINGS[label]
        for j, (ax, (n, what, sym)) in enumerate(zip(axes[i], panels)):
            th, th_se, ens, ens_se = curves[(label, n, what)]
            c = f"C{j}"
            ax.fill_between(times, th - 2 * th_se, th + 2 * th_se, color="0.6", alpha=0.35, lw=0)
            ax.plot(times, th, **common.THEORY)
            ax.errorbar(times, ens, yerr=2 * ens_se, fmt="o", ms=2.5, color=c, lw=0.8,
                        label=f"networks, N = {N}/{2 * N} extrapolated")
            ax.set_ylabel(sym)
            if i == len(labels) - 1:
                ax.set_xlabel("step t")
            if j == 0:
                ax.set_title(f"{label}: gamma = {s['gamma']:g}, y = {s['y']:g}, eta = {s['eta']:g}", loc="left",
                             fontsize=8.5)
    fig.suptitle(f"two_layer_sgd.dmft vs optax-trained networks (E = {E} per width; points: extrapolated from "
                 f"N = {N} and {2 * N}, 2 se bars) and the spec's solution ({samples} paths; dashed, band 2 se)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.975))
    common.save_figure(fig, args.out, "two_layer_sgd")
    common.finish_bounds(agree, args.out, REL_MEAN, REL_NVAR)


if __name__ == "__main__":
    main()
