"""The O(1/N) correction to the mean of relu networks: how the kink's delta functions enter m1.  Reported, not
asserted (issue 13: relu's sensitivities are approximate).

Spec two_layer with its activation replaced by sqrt(2) max(0, h) (one training point, one test point at
x.x_star/D = 0.5), rich training, several gamma.  m1's derivatives of the single-site march (dmftc.runtime.engines.site_engine)
differentiate phi' = sqrt(2) Heaviside(h): its derivative, and that derivative's, are the delta function and its
derivative, taken as Gaussians of the solve's ``dirac_width``.  Three widths:

* 0.1 (the default): the mollified delta and delta' terms enter m1, with a smoothing bias;
* 0.03: less bias, but the delta' terms' Monte Carlo variance grows like a power of 1 / width;
* 0 (the delta dropped, as the former two-layer engine's m1 did, dmftc.reference.two_layer_mean_correction):
  no variance from the kink, but its contribution to the second derivative of the averages is missing.

Ground truth: ensembles of width-N relu networks measured with common random numbers
(dmftc.validation.truth.mean_shift_truth), N = 64 and 128, Richardson-extrapolated in 1/N.  Reported per
order parameter and width: max pointwise z and max |m1 - networks| relative to the networks' peak.

    python experiments/relu_mean_correction.py [--quick] [--out DIR]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.truth import mean_shift_truth  # noqa: E402

NAMES = ("Delta", "f_star", "K", "K_star")
WIDTHS = (0.1, 0.03, 0.0)
SEED = 1700


def main():
    args = common.parse_args("relu_mean_correction", __doc__)
    if args.quick:
        gammas, T, eta, E, batches, samples, groups = (1.0,), 20, 0.05, 4000, 16, 8000, 8
    else:
        gammas, T, eta, E, batches, samples, groups = (0.5, 1.0, 1.5), 40, 0.05, 64000, 32, 64000, 16
    widths_N = (64, 128)
    text = (common.SPECS / "two_layer.dmft").read_text()
    relu = text.replace("activation phi(h) = tanh(h)", "activation phi(h) = sqrt(2) * max(0, h)")
    assert relu != text
    spec = args.out / "two_layer_relu.dmft"
    spec.write_text(relu.replace("model two_layer ", "model two_layer_relu ", 1))
    model = dmftc.load(spec, out_dir=args.out / "generated")
    agree = common.Agreement("relu_mean_correction", args.quick)
    agree.meta.update(spec="two_layer with sqrt(2) max(0, h)", gammas=gammas, T=T, eta=eta, E=E, batches=batches,
                      samples=samples, groups=groups, widths_N=widths_N, dirac_widths=WIDTHS)
    plt = common.pyplot()
    fig, axes = plt.subplots(len(gammas), len(NAMES), figsize=(14, 3.2 * len(gammas)), squeeze=False)
    styles = {0.1: dict(color="k", ls="--"), 0.03: dict(color="tab:purple", ls=":"), 0.0: dict(color="tab:orange",
                                                                                                ls="-.")}
    arrays = {}
    for row, gamma in enumerate(gammas):
        params = dict(gamma=gamma, T=T, eta=eta)
        sols = {w: model.solve(samples=samples, groups=groups, seed=SEED + row, correction=True, dirac_width=w,
                               **params) for w in WIDTHS}
        shifts = {N: mean_shift_truth(model, params, N=N, E=E, batches=batches, seed=SEED + 10 * row + N,
                                      network="two_layer", activation="relu") for N in widths_N}
        a, b = shifts[widths_N[0]], shifts[widths_N[1]]
        for j, n in enumerate(NAMES):
            ext, ext_se = common.richardson(a.value[n], a.se[n], b.value[n], b.se[n])
            ax = axes[row, j]
            ax.plot(sols[0.1].times, ext, color="tab:red", lw=1.4, label=f"networks, extrapolated {widths_N}")
            ax.fill_between(sols[0.1].times, ext - 2 * ext_se, ext + 2 * ext_se, color="tab:red", alpha=0.15, lw=0)
            for w, sol in sols.items():
                m, s = sol.mean_correction(n), sol.mean_correction(n, stderr=True)
                agree.add(f"gamma={gamma:g} m1[{n}] width {w:g}", m, s, ext, ext_se, raw=b.value[n], check=False)
                ax.plot(sol.times, m, lw=1.2, label=f"m1, dirac_width {w:g}", **styles[w])
                arrays[f"m1_{n}_g{gamma:g}_w{w:g}"], arrays[f"m1_se_{n}_g{gamma:g}_w{w:g}"] = m, s
            arrays[f"ensemble_{n}_g{gamma:g}"], arrays[f"ensemble_se_{n}_g{gamma:g}"] = ext, ext_se
            ax.set(title=f"gamma = {gamma:g}: {n}", xlabel="t", ylabel=rf"$N(\langle {n} \rangle_N - {n}_\infty)$")
    common.finish_row_figure(plt, fig, axes[0, 0], "relu: O(1/N) mean correction m1 at three delta widths vs "
                             "width-N networks (common random numbers)", args.out, "relu_mean_correction")
    np.savez_compressed(args.out / "relu_mean_correction.npz", **arrays)
    agree.finish(args.out)


if __name__ == "__main__":
    main()
