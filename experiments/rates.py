"""Perturbation theory in rates rather than predictions (paper App. "Perturbation Theory in Rates rather than
Predictions"): the ensemble-averaged training loss at width N as a time rescaling of the infinite-width curve.

Spec rates (the two-layer tanh network on one point, with the rate r(t) = -log(Delta(t) / y) as an order
parameter defined from Delta at the same time).  The loss is y^2 exp(-2 r) and, by the cumulant expansion,
E[Delta^2]_N = y^2 exp(-2 R_N(t)) with the width-N rate

    R_N(t) = r_inf(t) + R_1(t) / N + O(N^-2),     R_1 = m1_r - Sigma_rr(t, t)

from the spec's mean correction and propagator of r (which equal the delta method applied to Delta,
-(m1_Delta / Delta) + Sigma_DD / (2 Delta^2) and Sigma_DD / Delta^2: reported).  The rate form resums the O(1/N)
shift of the rate into the exponent (a time rescaling); the direct form Delta_inf^2 + (2 Delta_inf m1 + Sigma) / N
is its linearisation.  Ground truth: width-N networks with common random numbers
(dmftc.validation.truth.mean_shift_truth: N (E[q]_N - q_inf) for r = -log(Delta / y) per member and for the
loss) at N = 64, 128, 256 (quick: 32, 64, 128).

Panels per gamma: (a) the loss at each N, networks (solid) against the rate form (dashed) and infinite width
(grey); (b) N (E[Delta^2]_N - Delta_inf^2) / Delta_inf^2, the relative loss shift, networks against both forms;
(c) the width-N rate R_N(t) - r_inf(t) times N, networks against R_1.

Agreement (asserted, z <= 4 at every t): m1_r against N (E[r]_N - r_inf) extrapolated from the two largest
widths; the rate form y^2 exp(-2 R_N) against the training loss of width-N networks (the plain ensemble mean
over E members, standard error std / sqrt(E)) at every N and gamma; and the rate form of the loss shift against
the common-random-number shift at the largest width.  Reported: the infinite-width loss against the same
plain ensembles (the comparison's power: it is rejected), the common-random-number shift at the smaller widths
(which resolves the O(1/N^2) term of the rate), and the direct form's z at each N (it misses the curvature in
1/N where |R_1| / N is not small).

    python experiments/rates.py [--quick] [--out DIR]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.truth import mean_shift_truth  # noqa: E402

SEED = 1700


def main():
    args = common.parse_args("rates", __doc__)
    if args.quick:
        gammas, T, eta, widths, E, samples = (1.0,), 60, 0.05, (32, 64, 128), 4000, 16000
    else:
        gammas, T, eta, widths, E, samples = (0.5, 1.0, 1.5), 250, 0.04, (64, 128, 256), 16000, 64000
    y = 1.0
    agree = common.Agreement("rates", args.quick)
    agree.meta.update(spec="rates", gammas=gammas, T=T, eta=eta, widths=widths, E=E, samples=samples,
                      truth="common random numbers, 16 batches")
    model = dmftc.load(common.SPECS / "rates.dmft")
    plt = common.pyplot()
    fig, axes = plt.subplots(len(gammas), 3, figsize=(15, 3.6 * len(gammas)), squeeze=False)
    colors = plt.cm.viridis(np.linspace(0.15, 0.8, len(widths)))
    arrays, direct_z, plain_power = {}, {}, {}
    for row, gamma in enumerate(gammas):
        params = dict(gamma=gamma, y=y, T=T, eta=eta)
        sol = model.solve(samples=samples, seed=SEED + row, correction=True, **params)
        d, m1, S = sol.mean("Delta"), sol.mean_correction("Delta"), sol.var("Delta")
        d_se = sol.mean_stderr("Delta")
        m1_se, S_se = sol.mean_correction("Delta", stderr=True), sol.stderr("Delta")
        t = sol.times
        ok = np.abs(d) > 0
        r_inf = sol.mean("r")
        R1 = sol.mean_correction("r") - sol.var("r")
        R1_se = np.hypot(sol.mean_correction("r", stderr=True), sol.stderr("r"))
        delta_method = -(m1 / d + S / (2 * d ** 2))
        agree.meta[f"gamma={gamma:g} R_1 spec vs delta method (max rel)"] = float(
            np.abs(R1 - delta_method).max() / np.abs(R1).max())
        shifts = {N: mean_shift_truth(model, params, N=N, E=E, batches=16, seed=SEED + 10 * row + N)
                  for N in widths}
        a, b = shifts[widths[-2]], shifts[widths[-1]]
        ext, ext_se = common.richardson(a.value["r"], a.se["r"], b.value["r"], b.se["r"])
        agree.add(f"gamma={gamma:g} m1[r]", sol.mean_correction("r"), sol.mean_correction("r", stderr=True),
                  ext, ext_se, raw=b.value["r"])
        axes[row, 0].plot(t, d ** 2, color="0.6", lw=1.2, label="infinite width")
        for c, N in zip(colors, widths):
            ens, ens_se = shifts[N].value["loss"], shifts[N].se["loss"]      # N (E[Delta^2]_N - Delta_inf^2)
            R_N = r_inf + R1 / N
            rate = N * (y ** 2 * np.exp(-2 * R_N) - d ** 2)
            rate_se = 2 * y ** 2 * np.exp(-2 * R_N) * R1_se
            direct = 2 * d * m1 + S
            direct_se = np.sqrt((2 * d * m1_se) ** 2 + S_se ** 2)
            # the comparison: the loss of width-N networks (plain ensemble mean, its own standard error)
            loss_rate = y ** 2 * np.exp(-2 * R_N)
            loss_rate_se = 2 * loss_rate * np.hypot(sol.mean_stderr("r"), R1_se / N)
            agree.add(f"gamma={gamma:g} N={N} loss, rate form", loss_rate, loss_rate_se, shifts[N].loss,
                      shifts[N].loss_se)
            inf_z = agree.add(f"gamma={gamma:g} N={N} loss, infinite width", d ** 2, 2 * np.abs(d) * d_se,
                              shifts[N].loss, shifts[N].loss_se, check=False,
                              note="reported: the power of the plain comparison")["z_max"]
            plain_power[f"gamma={gamma:g} N={N}"] = inf_z
            # common random numbers: N (E[Delta^2]_N - Delta_inf^2) to second-order noise, which resolves the
            # O(1/N^2) term of the rate at the smaller widths (asserted at the largest width only)
            agree.add(f"gamma={gamma:g} N={N} loss shift (CRN), rate form", rate, rate_se, ens, ens_se,
                      check=N == widths[-1], note=None if N == widths[-1] else
                      "reported: common random numbers resolve the O(1/N^2) term of the rate here")
            row_d = agree.add(f"gamma={gamma:g} N={N} loss shift, direct form", direct, direct_se, ens, ens_se,
                              check=False, note="reported: the linearised form")
            direct_z[f"gamma={gamma:g} N={N}"] = row_d["z_max"]
            loss_N = d ** 2 + ens / N
            axes[row, 0].plot(t, loss_N, color=c, lw=2, alpha=0.8, label=f"networks N = {N}")
            axes[row, 0].plot(t, y ** 2 * np.exp(-2 * R_N), **common.THEORY)
            axes[row, 1].plot(t[ok], ens[ok] / d[ok] ** 2, color=c, lw=2, alpha=0.8)
            axes[row, 1].plot(t[ok], rate[ok] / d[ok] ** 2, **common.THEORY)
            axes[row, 1].plot(t[ok], direct[ok] / d[ok] ** 2, color=c, lw=1, ls=":")
            # the measured width-N rate: R = -log(E[Delta^2]_N / y^2) / 2
            R_ens = -0.5 * np.log(loss_N / y ** 2)
            axes[row, 2].plot(t, N * (R_ens - r_inf), color=c, lw=2, alpha=0.8)
            arrays.update({f"ens_shift_g{gamma:g}_N{N}": ens, f"ens_shift_se_g{gamma:g}_N{N}": ens_se,
                           f"rate_shift_g{gamma:g}_N{N}": rate, f"direct_shift_g{gamma:g}": direct})
        axes[row, 2].plot(t, R1, **common.THEORY)
        axes[row, 2].fill_between(t, R1 - 2 * R1_se, R1 + 2 * R1_se, color="k", alpha=0.12, lw=0)
        arrays.update({f"R1_g{gamma:g}": R1, f"r_inf_g{gamma:g}": r_inf})
        axes[row, 0].set(yscale="log", title=f"(a) $\\gamma$ = {gamma:g}: training loss", xlabel="t",
                         ylabel=r"$\langle\Delta^2\rangle_N$")
        axes[row, 1].set(title="(b) relative loss shift (dotted: direct form)", xlabel="t",
                         ylabel=r"$N(\langle\Delta^2\rangle_N - \Delta_\infty^2) / \Delta_\infty^2$")
        axes[row, 2].set(title="(c) rate correction", xlabel="t", ylabel=r"$N (R_N - r_\infty)$ vs $R_1$")
    agree.meta["direct_form_max_z"] = direct_z
    agree.meta["infinite_width_loss_max_z"] = plain_power
    np.savez_compressed(args.out / "rates.npz", **arrays)
    common.finish_row_figure(plt, fig, axes[0, 0], "Perturbation theory in rates: the loss at width N is "
                             "y^2 exp(-2 R_N), R_N = r_inf + R_1 / N (dashed) vs width-N networks", args.out, "rates")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
