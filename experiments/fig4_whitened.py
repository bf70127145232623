"""Fig. 4: two-layer linear nets on P whitened points (spec linear_whitened), paper Fig. 4 a-d.

Targets have unit norm, y = 1/sqrt(P) in every component.  Panels:
(a) total prediction variance N sum_mu Var Delta_mu(t) for several P (gamma = 1): it grows
    with P although |y| is fixed (the P - 1 task-orthogonal directions fluctuate);
(b) mean training loss <|Delta(t)|^2> at width N for the same P;
(c), (d) the same for several gamma at fixed P: richer training reduces the variance.
Dashed black: DMFT (exact Gaussian backend); solid: ensembles of width-N networks.
The loss theory at width N is sol.expected_loss(N) = |Delta_inf|^2 + (2 Delta_inf . m1 + tr Sigma(t,t)) / N:
the infinite-width loss, the O(1/N) correction of the mean errors m1 (dmftc.runtime.engines.site_engine,
sampled source paths) and the leading variance.  In (b) the dotted curve is a narrow ensemble
(N = 2 P_max) where the leading-order picture breaks down (paper Fig. 4b; reported, not asserted).

Asserted (z <= 4) against ensembles Richardson-extrapolated from widths N and 2N:
<Delta_mu> and N Var(Delta_mu) for every mu and the total variance; and the O(1/N) shift of the loss,
N (<|Delta|^2>_N - |Delta_inf|^2) = 2 Delta_inf . m1 + tr Sigma, against width-64 and width-128 networks
measured with common random numbers (dmftc.validation.truth.mean_shift_truth) and extrapolated in 1/N (the
raw shifts, reported, resolve the O(1/N^2) term: a few % ~ P/N of the shift), at the times where the
leading order holds (its O(1/N) term at most half the infinite-width loss; later the exponentially small
|Delta_inf|^2 is overtaken and the expansion breaks down: reported with the time of breakdown).  The plain
ensemble loss at widths N and 2N is plotted and reported.  The extrapolated loss against |Delta_inf|^2 is
reported only: at late times the exponentially small infinite-width loss is dominated by slower
finite-width terms, and O(1/N^2) residuals of the extrapolation exceed its standard errors (see the
comment in main).

    python experiments/fig4_whitened.py [--quick] [--out DIR]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.truth import mean_shift_truth  # noqa: E402
from dmftc.validation.ensemble import simulate_two_layer  # noqa: E402

SEED = 400


def ensemble(P, gamma, eta, T, N, E, seed):
    """Width-N linear networks on whitened data (same network as finite_width_truth('linear_whitened'))."""
    st = simulate_two_layer(activation="linear", Kx_all=np.eye(P), y=np.full(P, 1 / np.sqrt(P)), gamma=gamma,
                            eta=eta, T=T, N=N, E=E, seed=seed, keep_samples=True)
    x = st.samples["Delta"]                                   # (E, P, T)
    loss = (x ** 2).sum(axis=1)                               # |Delta|^2 per member
    out = {"mean": st.mean["Delta"], "mean_se": st.mean_se["Delta"],
           "nvar": st.nvar["Delta"], "nvar_se": st.nvar_se["Delta"],
           "loss": loss.mean(axis=0), "loss_se": loss.std(axis=0, ddof=1) / np.sqrt(E)}
    out["tot"], out["tot_se"] = common.total_nvar_stats(x, N)
    return out


def extrapolate(a, b):
    out = {}
    for k in ("mean", "nvar", "loss", "tot"):
        out[k], out[k + "_se"] = common.richardson(a[k], a[k + "_se"], b[k], b[k + "_se"])
    return out


def main():
    args = common.parse_args("fig4", __doc__)
    if args.quick:
        T, eta, N, E, Ps, gammas, P_fixed, samples = 40, 0.05, 256, 2000, (2, 4, 8), (0.5, 1.0, 2.0, 4.0), 4, 8000
        crn_widths, E_crn = (64, 128), 2000
    else:
        T, eta, N, E, Ps, gammas, P_fixed, samples = (100, 0.03, 512, 6000, (2, 4, 8, 16), (0.5, 1.0, 2.0, 4.0), 8,
                                                      32000)
        crn_widths, E_crn = (64, 128), 8000
    agree = common.Agreement("fig4_whitened", args.quick)
    agree.meta.update(T=T, eta=eta, widths=[N, 2 * N], plotted_width=N, E=E, P_values=Ps, gammas=gammas,
                      P_fixed=P_fixed, gamma_fixed=1.0)
    model = dmftc.load(common.SPECS / "linear_whitened.dmft")

    configs = sorted({(P, 1.0) for P in Ps} | {(P_fixed, g) for g in gammas})
    res, arrays = {}, {}
    for k, (P, g) in enumerate(configs):
        sol = model.solve(P=P, y=np.full(P, 1 / np.sqrt(P)), gamma=g, eta=eta, T=T, correction=True,
                          samples=samples, seed=SEED + k)
        seed = SEED + 10 * k
        a = ensemble(P, g, eta, T, N, E, seed)
        b = ensemble(P, g, eta, T, 2 * N, E, seed + 1)
        ext = extrapolate(a, b)
        th = {"mean": sol.mean("Delta"), "nvar": sol.var("Delta")}
        th["tot"] = th["nvar"].sum(axis=0)
        th["loss_inf"] = (th["mean"] ** 2).sum(axis=0)
        th["loss_N"], th["loss_N_se"] = sol.expected_loss(N), sol.expected_loss(N, stderr=True)
        th["loss_2N"], th["loss_2N_se"] = sol.expected_loss(2 * N), sol.expected_loss(2 * N, stderr=True)
        lab = f"P={P} gamma={g:g}"
        zero = np.zeros(T)
        agree.add(f"{lab} <Delta_mu>", th["mean"], 0 * th["mean"], ext["mean"], ext["mean_se"], raw=a["mean"])
        agree.add(f"{lab} N Var(Delta_mu)", th["nvar"], 0 * th["nvar"], ext["nvar"], ext["nvar_se"], raw=a["nvar"])
        agree.add(f"{lab} N sum Var(Delta_mu)", th["tot"], zero, ext["tot"], ext["tot_se"], raw=a["tot"])
        # Not asserted: at late times |Delta_inf|^2 is exponentially small while the finite-width terms decay
        # more slowly (task-orthogonal modes), so the loss's 1/N expansion has coefficients growing with t and
        # a two-width Richardson extrapolation leaves O(1/N^2) residuals far above the (tiny) standard errors
        # (full mode: z ~ 5-11 at t ~ 3 for P >= 8; the extrapolate even turns negative).  The pieces of the
        # loss, <Delta_mu> and the variances, are asserted above.
        agree.add(f"{lab} <|Delta|^2>, N->inf", th["loss_inf"], zero, ext["loss"], ext["loss_se"], check=False,
                  local=True, note="Richardson-extrapolated loss; O(1/N^2) terms dominate at late times")
        # The 1/N expansion of the loss holds while its O(1/N) term is small against the infinite-width loss;
        # late in training |Delta_inf|^2 decays exponentially and the O(1/N) and O(1/N^2) terms take over
        # (breakdown, reported).  Asserted where the correction is at most half the leading term.
        for width, ens_w, key in ((N, a, "loss_N"), (2 * N, b, "loss_2N")):
            agree.add(f"{lab} <|Delta|^2> at N={width}", th[key], th[key + "_se"], ens_w["loss"], ens_w["loss_se"],
                      check=False, local=True, note="plain ensemble mean (its O(N^-1/2) member fluctuations "
                      "leave the O(1/N) shift at ~2 se); asserted below with common random numbers")
        # The O(1/N) shift of the loss, N (<|Delta|^2>_N - |Delta_inf|^2) = 2 Delta_inf . m1 + tr Sigma, measured
        # with common random numbers (validation.truth.mean_shift_truth).  The 1/N expansion holds while that
        # term over N is small against |Delta_inf|^2; late in training |Delta_inf|^2 decays exponentially and
        # the O(1/N) and O(1/N^2) terms take over: asserted where the O(1/N) term is at most half the leading
        # one, the rest reported with the time of breakdown.
        coeff = 2 * (th["mean"] * sol.mean_correction("Delta")).sum(axis=0) + th["tot"]
        coeff_se = np.sqrt(((2 * th["mean"] * sol.mean_correction("Delta", stderr=True)) ** 2).sum(axis=0))
        shifts = {}
        for j, width in enumerate(crn_widths):
            shifts[width] = shift = mean_shift_truth(model, dict(P=P, y=np.full(P, 1 / np.sqrt(P)), gamma=g, eta=eta,
                                                                 T=T), N=width, E=E_crn, batches=10, seed=seed + 100 + j)
            agree.add(f"{lab} loss shift at N={width} (P/N={P}/{width}), all t", coeff, coeff_se, shift.value["loss"],
                      shift.se["loss"], check=False, note="raw: includes the O(1/N^2) term (relative size ~P/N) "
                      "and the late-time breakdown")
        lo, hi = crn_widths
        xs, xs_se = common.richardson(shifts[lo].value["loss"], shifts[lo].se["loss"], shifts[hi].value["loss"],
                                        shifts[hi].se["loss"])
        ok = np.abs(coeff) / hi <= 0.5 * th["loss_inf"]
        t_break = float(sol.times[np.argmin(ok)]) if not ok.all() else None
        agree.add(f"{lab} loss shift, N={lo},{hi} extrapolated, leading order valid", coeff[ok], coeff_se[ok],
                  xs[ok], xs_se[ok], raw=shifts[hi].value["loss"][ok],
                  note=f"times where the O(1/N) term at N={hi} <= |Delta_inf|^2 / 2 (breakdown from t = {t_break})")
        for width in crn_widths:
            arrays[f"crn_loss_shift_P{P}_g{g:g}_N{width}"] = shifts[width].value["loss"]
        res[P, g] = (sol, th, a)
        for key, v in {**{f"theory_{q}": th[q] for q in th}, **{f"ens_{q}": a[q] for q in a},
                       **{f"extrap_{q}": ext[q] for q in ext}}.items():
            arrays[f"{key}_P{P}_g{g:g}"] = v

    # Known breakdown (paper Fig. 4b): P comparable to N.  Reported, not asserted.
    P_max = max(Ps)
    N_small = 2 * P_max
    sol, th, _ = res[P_max, 1.0]
    small = ensemble(P_max, 1.0, eta, T, N_small, E, SEED + 999)
    agree.add(f"P={P_max} gamma=1 <|Delta|^2> at N={N_small} (P/N=1/2)", sol.expected_loss(N_small),
              sol.expected_loss(N_small, stderr=True), small["loss"], small["loss_se"], check=False, local=True,
              note="leading order breaks down when P is comparable to N (paper Fig. 4b)")
    arrays[f"ens_loss_P{P_max}_N{N_small}"] = small["loss"]
    times = sol.times
    np.savez_compressed(args.out / "fig4_whitened.npz", times=times, **arrays)

    # ------------------------------------------------------------------ figure
    plt = common.pyplot()
    fig, ax = plt.subplots(2, 2, figsize=(10, 7.5))
    ax = ax.ravel()
    pc = plt.cm.viridis(np.linspace(0.05, 0.85, len(Ps)))
    gc = plt.cm.plasma(np.linspace(0.05, 0.8, len(gammas)))
    for c, P in zip(pc, Ps):
        _, th, a = res[P, 1.0]
        ax[0].plot(times, a["tot"], color=c, lw=1.6, label=f"P = {P}")
        ax[0].plot(times, th["tot"], **common.THEORY)
        ax[1].semilogy(times, a["loss"], color=c, lw=1.6, label=f"P = {P}")
        ax[1].semilogy(times, th["loss_N"], **common.THEORY)
    ax[1].semilogy(times, small["loss"], color=pc[-1], ls=":", lw=1.8, label=f"P = {P_max}, N = {N_small}")
    ax[1].semilogy(times, sol.expected_loss(N_small), **common.THEORY)
    for c, g in zip(gc, gammas):
        _, th, a = res[P_fixed, g]
        ax[2].plot(times, a["tot"], color=c, lw=1.6, label=f"$\\gamma$ = {g:g}")
        ax[2].plot(times, th["tot"], **common.THEORY)
        ax[3].semilogy(times, a["loss"], color=c, lw=1.6, label=f"$\\gamma$ = {g:g}")
        ax[3].semilogy(times, th["loss_N"], **common.THEORY)
    var_label = r"$N \sum_\mu \mathrm{Var}\,\Delta_\mu(t)$"
    loss_label = r"$\langle |\mathbf{\Delta}(t)|^2 \rangle$"
    ax[0].set(title=r"(a) prediction variance vs $P$ ($\gamma$ = 1)", ylabel=var_label)
    ax[1].set(title=r"(b) training loss at width N vs $P$ ($\gamma$ = 1)", ylabel=loss_label)
    ax[2].set(title=f"(c) prediction variance vs $\\gamma$ (P = {P_fixed})", ylabel=var_label)
    ax[3].set(title=f"(d) training loss at width N vs $\\gamma$ (P = {P_fixed})", ylabel=loss_label)
    for a_ in ax:
        a_.set_xlabel("t")
        h, lab = a_.get_legend_handles_labels()
        a_.legend(h + [common.theory_handle(plt)], lab + ["DMFT"])
    fig.suptitle(f"Linear net, whitened data, $|y|$ = 1: width N = {N} ensembles (solid, E = {E}) vs DMFT (dashed; "
                 "loss: $|\\Delta_\\infty|^2 + (2\\Delta_\\infty\\cdot m_1 + \\mathrm{tr}\\,\\Sigma)/N$)")
    fig.tight_layout()
    common.save_figure(fig, args.out, "fig4_whitened")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
