"""Fig. 5: depth-4 linear network (L = 3 hidden layers), one training point, several gamma.

Panels: (a) N Var Delta(t), (b) N Var K(t), (c) N Var Phi[l](t,t) by layer, (d) N Var G[l](t,t)
by layer.  Feature kernels accumulate variance along the forward pass (Phi[1] < Phi[2] <
Phi[3]), gradient kernels along the backward pass, and the gap grows with gamma.
Dashed black: DMFT propagator of specs/deep_linear.dmft (the exact discrete-time Gaussian action the spec
states, its autodiff Hessian); solid: ensembles of width-N networks
(dmftc.validation.deep_ensemble) trained by discrete gradient descent.

Agreement (asserted, z <= 4): means and N Var of Delta, K, Phi[l](t,t), G[l](t,t) against
ensembles Richardson-extrapolated from widths N and 2N, for every gamma.

    python experiments/fig5_deep_linear.py [--quick] [--out DIR]
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

L, Y, SEED = 3, 1.0, 500


def main():
    args = common.parse_args("fig5", __doc__)
    if args.quick:
        gammas, T, eta, N, E = (0.5, 1.5), 16, 0.08, 256, 1000
    else:
        gammas, T, eta, N, E = (0.5, 1.0, 2.0), 30, 0.05, 512, 4000
    agree = common.Agreement("fig5_deep_linear", args.quick)
    agree.meta.update(L=L, y=Y, gammas=gammas, T=T, eta=eta, widths=[N, 2 * N], E=E, plotted_width=N)
    names = ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    times = eta * np.arange(T)
    arrays, results = {}, {}
    spec = dmftc.load(common.SPECS / "deep_linear.dmft")
    for i, g in enumerate(gammas):
        prop = spec.solve(L=L, gamma=g, y=Y, eta=eta, T=T)
        kw = dict(activation="linear", L=L, gamma=g, y=Y, eta=eta, T=T, E=E)
        raw = simulate_deep(N=N, seed=SEED + 10 * i, **kw)
        big = simulate_deep(N=2 * N, seed=SEED + 10 * i + 1, **kw)
        theory_mean = {n: prop.mean(n) if prop.mean(n).ndim == 1 else np.diag(prop.mean(n)) for n in names}
        for n in names:
            ens_mean = raw.mean[n] if raw.mean[n].ndim == 1 else np.diag(raw.mean[n])
            big_mean = big.mean[n] if big.mean[n].ndim == 1 else np.diag(big.mean[n])
            se_n = raw.se_mean[n] if raw.se_mean[n].ndim == 1 else np.diag(raw.se_mean[n])
            se_2n = big.se_mean[n] if big.se_mean[n].ndim == 1 else np.diag(big.se_mean[n])
            m, m_se = common.richardson(ens_mean, se_n, big_mean, se_2n)
            v, v_se = common.richardson(raw.nvar[n], raw.se_nvar[n], big.nvar[n], big.se_nvar[n])
            agree.add(f"gamma={g:g} <{n}>", theory_mean[n], 0.0, m, m_se, raw=ens_mean)
            agree.add(f"gamma={g:g} N Var({n})", prop.var(n), 0.0, v, v_se, raw=raw.nvar[n])
            arrays.update({f"theory_mean_{n}_g{g:g}": theory_mean[n], f"theory_nvar_{n}_g{g:g}": prop.var(n),
                           f"ens_mean_{n}_g{g:g}": ens_mean, f"ens_nvar_{n}_g{g:g}": raw.nvar[n],
                           f"ens_nvar_se_{n}_g{g:g}": raw.se_nvar[n],
                           f"extrap_mean_{n}_g{g:g}": m, f"extrap_nvar_{n}_g{g:g}": v})
        results[g] = (prop, raw)
    np.savez_compressed(args.out / "fig5_deep_linear.npz", times=times, gammas=np.array(gammas), **arrays)

    plt = common.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    colors = plt.cm.viridis(np.linspace(0.1, 0.8, len(gammas)))
    for c, g in zip(colors, gammas):
        prop, raw = results[g]
        for ax, n in zip(axes[:2], ("Delta", "K")):
            ax.plot(times, raw.nvar[n], color=c, lw=2.2, alpha=0.85, label=f"$\\gamma$ = {g:g}")
            ax.plot(times, prop.var(n), **common.THEORY)
    g = gammas[-1]
    prop, raw = results[g]
    layer_colors = plt.cm.plasma(np.linspace(0.1, 0.75, L))
    for ax, kind in zip(axes[2:], ("Phi", "G")):
        for lc, l in zip(layer_colors, range(1, L + 1)):
            n = f"{kind}[{l}]"
            ax.plot(times, raw.nvar[n], color=lc, lw=2.2, alpha=0.85, label=f"layer {l}")
            ax.plot(times, prop.var(n), **common.THEORY)
        ax.legend(loc="best")
    axes[0].set(title="(a) error variance", ylabel=r"$N\,\mathrm{Var}\,\Delta(t)$")
    axes[1].set(title="(b) NTK variance", ylabel=r"$N\,\mathrm{Var}\,K(t)$")
    axes[2].set(title=f"(c) feature kernels, $\\gamma$ = {g:g}", ylabel=r"$N\,\mathrm{Var}\,\Phi^\ell(t,t)$")
    axes[3].set(title=f"(d) gradient kernels, $\\gamma$ = {g:g}", ylabel=r"$N\,\mathrm{Var}\,G^\ell(t,t)$")
    for ax in axes:
        ax.set_xlabel(r"$t = \eta\,\times$ step")
    common.finish_row_figure(plt, fig, axes[0], f"Depth-4 linear network (L = {L} hidden layers), one point: "
                             f"width N = {N} ensembles (E = {E}, solid) vs DMFT propagator (dashed)",
                             args.out, "fig5_deep_linear")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
