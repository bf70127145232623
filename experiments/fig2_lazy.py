"""Fig. 2: lazy limit -- two-layer sqrt(2)-ReLU net, gamma = 0.05, P random points (spec two_layer_multi).

Inputs x_mu ~ N(0, I_D) (D = 20, fixed seed) enter through Kx = X X^T / D; targets
y_mu ~ N(0, 1) (fixed seed).  Panels (paper Fig. 2): (a) mean errors <Delta_mu(t)>;
(b) N Var of the error eigenmodes Delta_k = phi_k . Delta, phi_k the eigenvectors of the
infinite-width NTK K(0) (largest eigenvalues); (c) the total variance
N sum_mu Var Delta_mu(t).  Dashed black: DMFT (Monte Carlo backend); solid: width-N
ensembles.  P = 10 in full mode (as in the paper), P = 4 with --quick.

Asserted (z <= 4) against ensembles Richardson-extrapolated from widths N and 2N:
<Delta_mu>, N Var(Delta_mu), <K_mu,nu>, N Var(K_mu,nu) (all components), the eigenmode
variances and the total variance.  Theory standard errors: Solution.stderr per
component; for the total the sum of the component errors (an upper bound); for an
eigenmode the largest relative component error times its value (the solver reports
no errors of off-diagonal covariances; it is a small term next to the ensemble's).

    python experiments/fig2_lazy.py [--quick] [--out DIR]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.ensemble import simulate_two_layer  # noqa: E402

GAMMA, D, DATA_SEED, SEED = 0.05, 20, 2, 200


def ensemble(Kx, y, eta, T, N, E, seed, phi):
    """Width-N ReLU networks (same network as finite_width_truth('two_layer_multi')) and projections."""
    st = simulate_two_layer(activation="relu", Kx_all=Kx, y=y, gamma=GAMMA, eta=eta, T=T, N=N, E=E, seed=seed,
                            keep_samples=True)
    x = st.samples["Delta"]                                   # (E, P, T)
    out = {f"{k}_{q}": getattr(st, k)[q] for k in ("mean", "nvar", "mean_se", "nvar_se") for q in ("Delta", "K")}
    xk = np.einsum("pk,ept->ekt", phi, x)                     # eigenmode projections
    _, out["mode_nvar"], _, out["mode_nvar_se"] = common.sample_stats(xk, N)
    out["tot"], out["tot_se"] = common.total_nvar_stats(x, N)
    return out


def main():
    args = common.parse_args("fig2", __doc__)
    if args.quick:
        P, T, eta, N, E, samples, n_modes = 4, 30, 0.1, 256, 2000, 20000, 4
    else:
        P, T, eta, N, E, samples, n_modes = 10, 60, 0.06, 512, 6000, 20000, 5
    rng = np.random.default_rng(DATA_SEED)
    X = rng.standard_normal((P, D))
    Kx, y = X @ X.T / D, rng.standard_normal(P)
    agree = common.Agreement("fig2_lazy", args.quick)
    agree.meta.update(P=P, D=D, gamma=GAMMA, T=T, eta=eta, widths=[N, 2 * N], plotted_width=N, E=E,
                      samples=samples, Kx=Kx, y=y)

    model = dmftc.load(common.SPECS / "two_layer_multi.dmft")
    sol = model.solve(P=P, Kx=Kx, y=y, gamma=GAMMA, eta=eta, T=T, samples=samples, seed=21)
    lam, phi = np.linalg.eigh(sol.mean("K")[:, :, 0])        # infinite-width NTK at t = 0
    lam, phi = lam[::-1], phi[:, ::-1]                        # largest eigenvalue first
    phi = phi * np.sign(phi.sum(axis=0, keepdims=True) + 1e-300)
    agree.meta["ntk_eigenvalues"] = lam

    a = ensemble(Kx, y, eta, T, N, E, SEED, phi)
    b = ensemble(Kx, y, eta, T, 2 * N, E, SEED + 1, phi)
    ext = {}
    for k, se in (("mean_Delta", "mean_se_Delta"), ("nvar_Delta", "nvar_se_Delta"), ("mean_K", "mean_se_K"),
                  ("nvar_K", "nvar_se_K"), ("mode_nvar", "mode_nvar_se"), ("tot", "tot_se")):
        ext[k], ext[k + "_se"] = common.richardson(a[k], a[se], b[k], b[se])

    # theory
    S = sol.sigma("Delta")                                    # (P, T, P, T)
    t = np.arange(T)
    C = S[:, t, :, t]                                         # (T, P, P) equal-time covariance
    th_modes = np.einsum("pk,tpq,qk->kt", phi, C, phi)
    var_d, se_d = sol.var("Delta"), sol.stderr("Delta")
    rel_se = np.max(se_d / np.maximum(var_d, 1e-300), axis=0)  # worst relative component error per time
    th_modes_se = np.abs(th_modes) * rel_se
    th_tot, th_tot_se = var_d.sum(axis=0), se_d.sum(axis=0)

    agree.add("<Delta_mu>", sol.mean("Delta"), sol.stderr("Delta", "mean"), ext["mean_Delta"],
              ext["mean_Delta_se"], raw=a["mean_Delta"])
    agree.add("N Var(Delta_mu)", var_d, se_d, ext["nvar_Delta"], ext["nvar_Delta_se"], raw=a["nvar_Delta"])
    agree.add("<K_mu,nu>", sol.mean("K"), sol.stderr("K", "mean"), ext["mean_K"], ext["mean_K_se"],
              raw=a["mean_K"])
    agree.add("N Var(K_mu,nu)", sol.var("K"), sol.stderr("K"), ext["nvar_K"], ext["nvar_K_se"], raw=a["nvar_K"])
    for k in range(P):
        agree.add(f"N Var(Delta_k) mode {k + 1} (lambda={lam[k]:.3g})", th_modes[k], th_modes_se[k],
                  ext["mode_nvar"][k], ext["mode_nvar_se"][k], raw=a["mode_nvar"][k])
    agree.add("N sum_mu Var(Delta_mu)", th_tot, th_tot_se, ext["tot"], ext["tot_se"], raw=a["tot"])

    arrays = {"times": sol.times, "Kx": Kx, "y": y, "ntk_eigenvalues": lam, "ntk_eigenvectors": phi,
              "theory_mean_Delta": sol.mean("Delta"), "theory_nvar_Delta": var_d, "theory_nvar_se_Delta": se_d,
              "theory_mean_K": sol.mean("K"), "theory_nvar_K": sol.var("K"), "theory_mode_nvar": th_modes,
              "theory_total_nvar": th_tot}
    arrays.update({f"ens_{k}": v for k, v in a.items()})
    arrays.update({f"extrap_{k}": v for k, v in ext.items()})
    np.savez_compressed(args.out / "fig2_lazy.npz", **arrays)

    # ------------------------------------------------------------------ figure
    plt = common.pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.9))
    times = sol.times
    cs = plt.cm.tab10(np.arange(P) % 10)
    for mu in range(P):
        ax[0].plot(times, a["mean_Delta"][mu], color=cs[mu], lw=1.5)
        ax[0].plot(times, sol.mean("Delta")[mu], **common.THEORY)
    cm = plt.cm.viridis(np.linspace(0.05, 0.85, n_modes))
    for k in range(n_modes):
        ax[1].plot(times, a["mode_nvar"][k], color=cm[k], lw=1.6, label=f"k = {k + 1}, $\\lambda_k$ = {lam[k]:.2f}")
        ax[1].plot(times, th_modes[k], **common.THEORY)
    ax[2].plot(times, a["tot"], color="C3", lw=1.8, label=f"N = {N} ensemble")
    ax[2].plot(times, th_tot, **common.THEORY, label="DMFT theory")
    ax[0].set(title=r"(a) average errors $\langle \Delta_\mu(t) \rangle$", ylabel=r"$\langle\Delta_\mu(t)\rangle$")
    ax[1].set(title="(b) eigenmode variances", ylabel=r"$N\,\mathrm{Var}\,\Delta_k(t)$")
    ax[2].set(title="(c) total train variance", ylabel=r"$N \sum_\mu \mathrm{Var}\,\Delta_\mu(t)$")
    ax[0].legend([plt.Line2D([], [], color="0.4", lw=1.5), common.theory_handle(plt)],
                 [f"N = {N} ensemble (one colour per $\\mu$)", "DMFT theory"])
    h, lab = ax[1].get_legend_handles_labels()
    ax[1].legend(h + [common.theory_handle(plt)], lab + ["DMFT theory"])
    ax[2].legend()
    for a_ in ax:
        a_.set_xlabel("t")
    fig.suptitle(f"Lazy limit: sqrt(2)-ReLU net, $\\gamma$ = {GAMMA}, P = {P} random points (D = {D}): "
                 f"width N = {N} ensembles (solid, E = {E}) vs DMFT (dashed)")
    fig.tight_layout()
    common.save_figure(fig, args.out, "fig2_lazy")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
