"""Two-time kernel covariances of a depth-4 linear network (paper App. figure "The covariance of kernel entries
across pairs of time points"): Sigma_{Phi^l}(t, s) = lim N Cov(Phi^l(t,t), Phi^l(s,s)) for l = 1..3.

Theory: ``sol.sigma("Phi[l]", "Phi[l]")`` of specs/deep_linear.dmft with L = 3 (exact propagator of the
discrete-time Gaussian action).  Ground truth: width-N and 2N networks trained by gradient descent
(dmftc.validation.deep_ensemble), N Cov over members with the standard error of each entry from the spread of
the members' products of deviations, Richardson-extrapolated in 1/N.  One training point (the paper's figure
uses whitened data; deep specs take one point).

Panels, one row per gamma: the theory's Sigma_{Phi^3}(t, s) as a heat map, the extrapolated ensemble's, and
slices Sigma_{Phi^l}(t, s0) against t for every layer at s0 = T/3 and 2T/3 (dashed: theory).

Agreement (asserted): z <= 4 at every (t, s) for every layer and gamma.  Reported: the correlation time
tau_l = eta sum_t rho_l(t, s0) of the normalised covariance rho = Sigma(t,s) / sqrt(Sigma(t,t) Sigma(s,s)) at
s0 = 2T/3 for each gamma (the paper: "the variance becomes increasingly localized in time as gamma increases").

    python experiments/two_time_deep_linear.py [--quick] [--out DIR]
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

L, Y, SEED = 3, 1.0, 1300


def ncov_with_se(x: np.ndarray, N: int):
    """N Cov(x_t, x_s) over members (ddof = 1) and its standard error, from the members' d_i = dx_t dx_s."""
    E = x.shape[0]
    dx = x - x.mean(axis=0)
    prod = dx[:, :, None] * dx[:, None, :]
    cov = prod.sum(axis=0) / (E - 1)
    se = prod.std(axis=0, ddof=1) / np.sqrt(E)
    return N * cov, N * se


def main():
    args = common.parse_args("two_time_deep_linear", __doc__)
    if args.quick:
        gammas, T, eta, N, E = (0.5, 2.0), 12, 0.05, 128, 2000
    else:
        gammas, T, eta, N, E = (0.5, 1.0, 2.0), 30, 0.05, 256, 12000
    agree = common.Agreement("two_time_deep_linear", args.quick)
    agree.meta.update(L=L, y=Y, gammas=gammas, T=T, eta=eta, widths=[N, 2 * N], E=E)
    model = dmftc.load(common.SPECS / "deep_linear.dmft")
    names = [f"Phi[{l}]" for l in range(1, L + 1)]
    s0s = (T // 3, (2 * T) // 3)
    plt = common.pyplot()
    fig, axes = plt.subplots(len(gammas), 4, figsize=(17, 3.6 * len(gammas)), squeeze=False)
    lc = plt.cm.plasma(np.linspace(0.1, 0.7, L))
    arrays, tau = {}, {}
    for row, g in enumerate(gammas):
        sol = model.solve(L=L, gamma=g, y=Y, T=T, eta=eta)
        kw = dict(activation="linear", L=L, gamma=g, y=Y, eta=eta, T=T, E=E, keep_samples=True)
        runs = [simulate_deep(N=n, seed=SEED + 10 * row + k, **kw) for k, n in enumerate((N, 2 * N))]
        times = sol.times
        for l, n in enumerate(names, 1):
            theory = sol.sigma(n, n)
            (a, sa), (b, sb) = (ncov_with_se(r.samples[n], r.N) for r in runs)
            ext, ext_se = common.richardson(a, sa, b, sb)
            agree.add(f"gamma={g:g} Sigma_{n}(t,s)", theory, 0.0, ext, ext_se, raw=a)
            d = np.sqrt(np.diag(theory))
            rho = theory / np.maximum(np.outer(d, d), 1e-300)
            tau[f"gamma={g:g} {n}"] = float(eta * rho[:, s0s[1]].sum())
            arrays.update({f"theory_{n}_g{g:g}": theory, f"ensemble_{n}_N{N}_g{g:g}": a,
                           f"ensemble_se_{n}_N{N}_g{g:g}": sa, f"extrap_{n}_g{g:g}": ext,
                           f"extrap_se_{n}_g{g:g}": ext_se})
            if l == L:
                vmax = float(np.abs(theory).max())
                for ax, img, what in ((axes[row, 0], theory, "theory"), (axes[row, 1], ext, "networks, extrapolated")):
                    im = ax.imshow(img, origin="lower", extent=(times[0], times[-1], times[0], times[-1]),
                                   cmap="viridis", vmin=min(0.0, float(img.min())), vmax=vmax)
                    ax.set(title=f"$\\gamma$ = {g:g}: $\\Sigma_{{\\Phi^{L}}}(t,s)$, {what}", xlabel="s", ylabel="t")
                    fig.colorbar(im, ax=ax, shrink=0.8)
                    ax.grid(False)
            for ax, s0 in zip(axes[row, 2:], s0s):
                ax.plot(times, a[:, s0], color=lc[l - 1], lw=2, alpha=0.8, label=f"layer {l}, N = {N}")
                ax.fill_between(times, ext[:, s0] - 2 * ext_se[:, s0], ext[:, s0] + 2 * ext_se[:, s0],
                                color=lc[l - 1], alpha=0.15, lw=0)
                ax.plot(times, theory[:, s0], **common.THEORY)
                ax.axvline(times[s0], color="0.6", lw=0.8)
                ax.set(title=f"$\\gamma$ = {g:g}: $\\Sigma_{{\\Phi^\\ell}}(t, s_0)$, $s_0$ = {times[s0]:.2g}",
                       xlabel="t")
    agree.meta["correlation_time_at_s0"] = tau
    agree.meta["s0"] = [float(sol.times[s]) for s in s0s]
    np.savez_compressed(args.out / "two_time_deep_linear.npz", gammas=np.array(gammas), **arrays)
    common.finish_row_figure(plt, fig, axes[0, 2], f"Depth-4 linear network: two-time covariance of the feature "
                             f"kernels, theory vs width-{N}/{2 * N} networks (E = {E}; band: 2 se of the "
                             "extrapolation)", args.out, "two_time_deep_linear")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
