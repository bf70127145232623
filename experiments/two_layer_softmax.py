"""Softmax cross-entropy on C classes (spec two_layer_softmax) against networks trained by optax.

The spec ``specs/two_layer_softmax.dmft`` (two-layer tanh network with C outputs on P points, input Gram matrix
Kx, one-hot targets y, loss -sum_mu log softmax(f_mu)_{y_mu}) is solved by the Monte Carlo backend at settings
chosen before looking at the results: seeded random Wishart Gram matrices Kx = X X^T / D, random one-hot targets,
C = 2 and 3 classes, P = 2 ... 4 points, rich training (the outputs move by O(1)).  It is compared with ensembles
of width-N networks trained by gradient descent on the same loss in optax itself (dmftc.validation.optax_truth
with loss="softmax"), Richardson-extrapolated in 1/N from widths N and 2N.

Panels per setting (rows): <f>, N Var f, <Delta>, N Var Delta (Delta = y - softmax(f)), <K>, N Var K (the NTK
entries K[mu, c, nu, d]), a few components each; the spec's solution dashed with a band of 2 standard errors, the
extrapolated networks as points with 2 se bars.  Every component is compared.

Agreement (asserted): pointwise z = |theory - networks| / sqrt(se_theory^2 + se_networks^2) <= 4 for the means
and N Var of f, Delta and K; in full mode also max_t |theory - networks| within 1% of the peak for the means and
within 5% of the peak for N Var.

    python experiments/two_layer_softmax.py [--quick] [--out DIR] [--E E] [--samples S]

Full mode (T = 10, N = 64 and 128, E = 200000 networks per width, 200000 paths, three settings) took 10 minutes on
2 cores shared with other jobs; --quick (T = 6, N = 32 and 64, E = 6000, 20000 paths, two settings) 20 s there (15 s of CPU).
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

SEED = 900
NAMES = ("f", "Delta", "K")
# label -> data (seed of X ~ N(0, 1)^(P x D) and of the classes) and training
SETTINGS = {
    "P = 3, C = 2": dict(seed=7, P=3, C=2, D=5, gamma=1.3, eta=0.4),
    "P = 2, C = 3": dict(seed=8, P=2, C=3, D=4, gamma=0.8, eta=0.5),
    "P = 4, C = 3": dict(seed=11, P=4, C=3, D=6, gamma=1.0, eta=0.4),
}
QUICK = ("P = 3, C = 2", "P = 2, C = 3")


def data(seed: int, P: int, C: int, D: int) -> dict:
    """A Wishart Gram matrix X X^T / D of P standard normal points in D dimensions and one-hot random classes."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((P, D))
    return dict(Kx=X @ X.T / D, y=np.eye(C)[rng.integers(0, C, P)])


def components(name: str, P: int, C: int) -> list:
    """A few components to plot: f and Delta of the first points in every class (at most 3), diagonal NTK
    entries and one entry across points and classes."""
    if name == "K":
        return [(0, 0, 0, 0), (P - 1, C - 1, P - 1, C - 1), (0, 0, P - 1, C - 1)]
    return [(mu, c) for mu in range(min(P, 2)) for c in range(C)][:3]


def main():
    args = common.parse_args("two_layer_softmax", __doc__, common.ensemble_options)
    if args.quick:
        T, N, E, samples, labels = 6, 32, 6000, 20000, QUICK
    else:
        T, N, E, samples, labels = 10, 64, 200000, 200000, tuple(SETTINGS)
    E, samples = args.E or E, args.samples or samples
    agree = common.Agreement("two_layer_softmax", args.quick)
    agree.meta.update(T=T, widths=[N, 2 * N], E=E, samples=samples, settings={k: SETTINGS[k] for k in labels})
    model = dmftc.load(common.SPECS / "two_layer_softmax.dmft")
    arrays, curves = {}, {}
    for k, label in enumerate(labels):
        s = dict(SETTINGS[label])
        P, C = s["P"], s["C"]
        d = data(s.pop("seed"), P, C, s.pop("D"))
        train = dict(gamma=s["gamma"], eta=s["eta"], **d)
        sol = model.solve(T=T, P=P, C=C, backend="mc", samples=samples, seed=SEED + 10 * k, progress=False,
                          **train)
        nets = optax_truth(T=T, N=N, E=E, loss="softmax", seed=SEED + 10 * k + 1, **train)
        for n in NAMES:
            th = {"mean": (sol.mean(n), sol.mean_stderr(n)), "nvar": (sol.var(n), sol.var_stderr(n))}
            ens = {"mean": (nets.mean[n], nets.mean_se[n]), "nvar": (nets.nvar[n], nets.nvar_se[n])}
            common.add_mean_nvar(agree, label, n, th, ens, curves, arrays)
        arrays[f"{label}_Kx"], arrays[f"{label}_y"] = d["Kx"], d["y"]
    times = np.arange(T)
    np.savez_compressed(args.out / "two_layer_softmax.npz", steps=times, **arrays)

    plt = common.pyplot()
    fig, axes = plt.subplots(len(labels), 6, figsize=(19, 2.8 * len(labels)), squeeze=False)
    panels = [(n, what) for n in NAMES for what in ("mean", "nvar")]
    syms = {"f": "f", "Delta": r"\Delta", "K": "K"}
    for i, label in enumerate(labels):
        s = SETTINGS[label]
        for j, (ax, (n, what)) in enumerate(zip(axes[i], panels)):
            th, th_se, ens, ens_se = curves[(label, n, what)]
            for m, idx in enumerate(components(n, s["P"], s["C"])):
                c, sl = f"C{m}", idx + (slice(None),)
                ax.fill_between(times, th[sl] - 2 * th_se[sl], th[sl] + 2 * th_se[sl], color="0.6", alpha=0.3, lw=0)
                ax.plot(times, th[sl], **common.THEORY)
                ax.errorbar(times, ens[sl], yerr=2 * ens_se[sl], fmt="o", ms=2.5, color=c, lw=0.8,
                            label=f"{n}[{', '.join(str(x + 1) for x in idx)}]")
            sym = syms[n]
            ax.set_ylabel(rf"$\langle {sym}\rangle$" if what == "mean" else rf"$N\,\mathrm{{Var}}\,{sym}$")
            if what == "mean":
                ax.legend(fontsize=6.5, loc="best")
            if i == len(labels) - 1:
                ax.set_xlabel("step t")
            if j == 0:
                ax.set_title(f"{label}: gamma = {s['gamma']:g}, eta = {s['eta']:g} (Wishart seed {s['seed']}, "
                             f"D = {s['D']})", loc="left", fontsize=8.5)
    fig.suptitle(f"two_layer_softmax.dmft vs optax-trained networks (E = {E} per width; points: extrapolated from "
                 f"N = {N} and {2 * N}, 2 se bars) and the spec's solution ({samples} paths; dashed, band 2 se)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.975))
    common.save_figure(fig, args.out, "two_layer_softmax")
    common.finish_bounds(agree, args.out, 0.01, 0.05)


if __name__ == "__main__":
    main()
