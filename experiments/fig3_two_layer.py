"""Fig. 3: two-layer tanh network, one training point and one test point (spec two_layer).

Panels (paper Fig. 3, plus the 1/N collapse): (a) the mean square deviation from the
infinite-width DMFT, time-averaged, falls as 1/N for every order parameter;
(a') N Var(Delta(t)) at widths 128 ... 1024 collapses onto the DMFT propagator
(gamma = 1); (b) mean NTK <K(t)>, (c) mean test prediction <f_star(t)> (x.x_star/D = 0.5),
(d) N Var(Delta), (e) N Var(f_star), (f) N Var(K) and N Var(K_star) for several gamma.
Dashed black: DMFT (Monte Carlo backend); solid: ensembles of width-N tanh networks.

Agreement (asserted, z <= 4): means and N Var of Delta, f_star, K, K_star for every
gamma against ensembles Richardson-extrapolated from widths 256 and 512
(finite_width_truth(..., extrapolate=True)), and the same at gamma = 1 from the
widths 512 and 1024 of the collapse panel.

    python experiments/fig3_two_layer.py [--quick] [--out DIR]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.truth import finite_width_truth  # noqa: E402

GAMMAS, WIDTHS, N0, KX, SEED = (0.5, 1.0, 2.0), (128, 256, 512, 1024), 256, 0.5, 300
NAMES = ("Delta", "f_star", "K", "K_star")
LADDER_GAMMA = 1.0


def main():
    args = common.parse_args("fig3", __doc__)
    if args.quick:
        T, eta, E, samples = 50, 0.06, 2000, 10000
    else:
        T, eta, E, samples = 100, 0.04, 6000, 40000
    agree = common.Agreement("fig3_two_layer", args.quick)
    agree.meta.update(gammas=GAMMAS, ladder_widths=WIDTHS, ladder_gamma=LADDER_GAMMA, plotted_width=N0,
                      extrapolation_widths=[N0, 2 * N0], T=T, eta=eta, E=E, samples=samples, kx=KX)

    model = dmftc.load(common.SPECS / "two_layer.dmft")
    sols = [model.solve(gamma=g, T=T, eta=eta, kx=KX, y=1.0, samples=samples, seed=31, backend="mc") for g in GAMMAS]
    sol_of = dict(zip(GAMMAS, sols))
    arrays = {}

    # Width ladder at gamma = 1: width WIDTHS[k] uses seed SEED + k, so (WIDTHS[k], WIDTHS[k+1])
    # is exactly the pair finite_width_truth(WIDTHS[k], seed=SEED + k, extrapolate=True) runs.
    sol1 = sol_of[LADDER_GAMMA]
    ladder = {N: finite_width_truth("two_layer", sol1.params, N=N, E=E, seed=SEED + k) for k, N in enumerate(WIDTHS)}
    a, b = ladder[WIDTHS[-2]], ladder[WIDTHS[-1]]
    for n in NAMES:
        m, m_se = common.richardson(a.mean[n], a.mean_se[n], b.mean[n], b.mean_se[n])
        v, v_se = common.richardson(a.nvar[n], a.nvar_se[n], b.nvar[n], b.nvar_se[n])
        lab = f"gamma={LADDER_GAMMA:g} N={WIDTHS[-2]},{WIDTHS[-1]}"
        agree.add(f"{lab} <{n}>", sol1.mean(n), sol1.stderr(n, "mean"), m, m_se, raw=b.mean[n])
        agree.add(f"{lab} N Var({n})", sol1.var(n), sol1.stderr(n), v, v_se, raw=b.nvar[n])
    msd = {n: np.array([np.mean(ladder[N].nvar[n] / N + (ladder[N].mean[n] - sol1.mean(n)) ** 2) for N in WIDTHS])
           for n in NAMES}
    for N in WIDTHS:   # reported only: raw width-N curves carry O(1/N) corrections (and ensemble noise)
        agree.add(f"gamma={LADDER_GAMMA:g} raw N={N} N Var(Delta)", sol1.var("Delta"), sol1.stderr("Delta"),
                  ladder[N].nvar["Delta"], ladder[N].nvar_se["Delta"], check=False,
                  note="raw width-N ensemble, not extrapolated: carries O(1/N) corrections; reported only")
        arrays[f"ladder_nvar_Delta_N{N}"] = ladder[N].nvar["Delta"]
        arrays[f"ladder_nvar_se_Delta_N{N}"] = ladder[N].nvar_se["Delta"]
    arrays.update({f"msd_{n}": v for n, v in msd.items()}, widths=np.array(WIDTHS))
    agree.meta["msd_times_N"] = {n: (msd[n] * np.array(WIDTHS)).tolist() for n in NAMES}

    # gamma sweep: plotted width N0, asserted against the (N0, 2 N0) extrapolation.
    raws = {}
    for i, g in enumerate(GAMMAS):
        sol = sol_of[g]
        seed = SEED + WIDTHS.index(N0) if g == LADDER_GAMMA else SEED + 10 * (i + 1)
        ext = finite_width_truth("two_layer", sol.params, N=N0, E=E, seed=seed, extrapolate=True)
        raws[g] = ladder[N0] if g == LADDER_GAMMA else finite_width_truth("two_layer", sol.params, N=N0, E=E,
                                                                           seed=seed)
        common.add_truth(agree, f"gamma={g:g} N={N0},{2 * N0}", sol, ext, NAMES, raw=raws[g])
        for n in NAMES:
            arrays.update({f"theory_mean_{n}_g{g:g}": sol.mean(n), f"theory_nvar_{n}_g{g:g}": sol.var(n),
                           f"theory_nvar_se_{n}_g{g:g}": sol.stderr(n),
                           f"ens_mean_{n}_g{g:g}": raws[g].mean[n], f"ens_nvar_{n}_g{g:g}": raws[g].nvar[n],
                           f"ens_nvar_se_{n}_g{g:g}": raws[g].nvar_se[n],
                           f"extrap_mean_{n}_g{g:g}": ext.mean[n], f"extrap_nvar_{n}_g{g:g}": ext.nvar[n],
                           f"extrap_nvar_se_{n}_g{g:g}": ext.nvar_se[n]})
    times = sols[0].times
    np.savez_compressed(args.out / "fig3_two_layer.npz", times=times, gammas=np.array(GAMMAS), **arrays)

    # ------------------------------------------------------------------ figure
    plt = common.pyplot()
    fig, ax = plt.subplots(2, 4, figsize=(15, 7))
    ax = ax.ravel()
    W = np.array(WIDTHS, float)
    labels = {"Delta": r"$\Delta$", "f_star": r"$f_\star$", "K": r"$K$", "K_star": r"$K_\star$"}
    for n, mk in zip(NAMES, "osD^"):
        ax[0].loglog(W, msd[n], marker=mk, lw=1.5, label=labels[n])
        ax[0].loglog(W, msd[n][0] * W[0] / W, **common.THEORY)
    ax[0].set(title="(a) deviation from DMFT vs N", xlabel="width N",
              ylabel=r"$\overline{\langle (q(t) - q_\infty(t))^2 \rangle}_t$")
    ax[0].set_xticks(W, [str(N) for N in WIDTHS])
    ax[0].minorticks_off()
    ax[0].legend(title=r"$\gamma$ = 1; dashed $\propto 1/N$")
    wc = plt.cm.plasma(np.linspace(0.1, 0.8, len(WIDTHS)))
    for c, N in zip(wc, WIDTHS):
        ax[1].plot(times, ladder[N].nvar["Delta"], color=c, lw=1.5, label=f"N = {N}")
    ax[1].plot(times, sol1.var("Delta"), **common.THEORY, label="DMFT")
    ax[1].set(title=r"(a') $N\,\mathrm{Var}\,\Delta(t)$ across widths ($\gamma$ = 1)", ylabel=r"$N\,\mathrm{Var}\,\Delta$")
    ax[1].legend()
    gc = plt.cm.viridis(np.linspace(0.1, 0.8, len(GAMMAS)))
    panels = [(2, "K", "mean", r"(b) average NTK $\langle K(t)\rangle$"),
              (3, "f_star", "mean", r"(c) average test prediction $\langle f_\star(t)\rangle$"),
              (4, "Delta", "nvar", r"(d) train error variance $N\,\mathrm{Var}\,\Delta$"),
              (5, "f_star", "nvar", r"(e) test prediction variance $N\,\mathrm{Var}\,f_\star$"),
              (6, "K", "nvar", r"(f) kernel variance $N\,\mathrm{Var}\,K$"),
              (7, "K_star", "nvar", r"train-test kernel variance $N\,\mathrm{Var}\,K_\star$")]
    for j, n, what, title in panels:
        for c, g in zip(gc, GAMMAS):
            ens = raws[g].mean[n] if what == "mean" else raws[g].nvar[n]
            th = sol_of[g].mean(n) if what == "mean" else sol_of[g].var(n)
            ax[j].plot(times, ens, color=c, lw=1.6, label=f"$\\gamma$ = {g:g}")
            ax[j].plot(times, th, **common.THEORY)
        ax[j].set(title=title)
    ax[2].legend(ax[2].get_legend_handles_labels()[0] + [common.theory_handle(plt)],
                 [f"$\\gamma$ = {g:g}" for g in GAMMAS] + ["DMFT theory"])
    for a_ in ax[1:]:
        a_.set_xlabel("t")
    fig.suptitle(f"Two-layer tanh net, one train + one test point: width-N ensembles (solid, E = {E}; "
                 f"N = {N0} in (b)-(f)) vs DMFT (dashed black)")
    fig.tight_layout()
    common.save_figure(fig, args.out, "fig3_two_layer")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
