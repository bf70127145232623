"""Deep tanh network (L = 2 hidden layers), one training point: finite-width variances from the DMFT propagator.

Panels: (a) N Var Delta(t), (b) N Var K(t), (c) N Var Phi[l](t,t), (d) N Var G[l](t,t), l = 1, 2.
Dashed black with a grey band (+- 2 Monte Carlo standard errors): the propagator of deep NONLINEAR networks
(dmftc.runtime.engines.deep_propagator: Monte Carlo Hessian of the discrete-time MSR action, response functions and Price
terms included, per-path derivatives from the spec's program).  Solid: ensembles of width-N tanh networks trained by
discrete gradient descent (dmftc.validation.deep_ensemble).

Agreement (asserted): pointwise in time, z = |theory - ensemble| / sqrt(se_theory^2 + se_ensemble^2) <= 4,
with the ensemble N Var Richardson-extrapolated from widths N and 2N (removes the O(1/N) correction) and
se_theory the standard error over the propagator's independent groups (each group: its own saddle, Hessian
and inverse).  Means: DMFT vs extrapolated ensemble means, same rule.

    python experiments/deep_tanh_variance.py [--quick] [--out DIR]

Full mode is the issue's acceptance case (T = 40, eta = 0.05); it takes about 10 minutes on 2 cores.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # the simulator runs its own 2 threads

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dmftc.validation.deep_ensemble import simulate_deep  # noqa: E402
from dmftc.runtime.engines.deep_propagator import deep_propagator  # noqa: E402

L, GAMMA, Y, SEED = 2, 1.0, 1.0, 700


def main():
    args = common.parse_args("deep_tanh_variance", __doc__)
    if args.quick:
        T, eta, samples, groups, N, E = 8, 0.1, 4000, 8, 256, 1500
    else:
        T, eta, samples, groups, N, E = 40, 0.05, 8000, 8, 256, 4000
    agree = common.Agreement("deep_tanh_variance", args.quick)
    agree.meta.update(L=L, gamma=GAMMA, y=Y, T=T, eta=eta, samples=samples, groups=groups, widths=[N, 2 * N], E=E)
    names = ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    times = eta * np.arange(T)

    prop = deep_propagator(activation="tanh", L=L, gamma=GAMMA, y=Y, eta=eta, T=T, samples=samples,
                           groups=groups, seed=SEED)
    agree.meta.update({k: prop.diagnostics[k] for k in ("stationarity", "psd_within_mc", "time_total")})
    kw = dict(activation="tanh", L=L, gamma=GAMMA, y=Y, eta=eta, T=T, E=E)
    raw = simulate_deep(N=N, seed=SEED + 1, **kw)
    big = simulate_deep(N=2 * N, seed=SEED + 2, **kw)
    diag = lambda a: a if a.ndim == 1 else np.diag(a)  # noqa: E731
    arrays = {}
    for n in names:
        key = n if n in ("Delta", "K") else n
        th_mean = diag(prop.saddle[key])
        th_mean_se = diag(prop.saddle_se[key])
        m, m_se = common.richardson(diag(raw.mean[n]), diag(raw.se_mean[n]), diag(big.mean[n]), diag(big.se_mean[n]))
        v, v_se = common.richardson(raw.nvar[n], raw.se_nvar[n], big.nvar[n], big.se_nvar[n])
        agree.add(f"<{n}>", th_mean, th_mean_se, m, m_se, raw=diag(raw.mean[n]))
        agree.add(f"N Var({n})", prop.var(n), prop.se_var(n), v, v_se, raw=raw.nvar[n])
        arrays.update({f"theory_nvar_{n}": prop.var(n), f"theory_nvar_se_{n}": prop.se_var(n),
                       f"theory_mean_{n}": th_mean, f"ens_nvar_{n}": raw.nvar[n], f"ens_nvar_se_{n}": raw.se_nvar[n],
                       f"ens2_nvar_{n}": big.nvar[n], f"extrap_nvar_{n}": v, f"extrap_nvar_se_{n}": v_se})
    np.savez_compressed(args.out / "deep_tanh_variance.npz", times=times, **arrays)

    plt = common.pyplot()
    fig, axes, panels, colors = common.deep_panels(plt, L)
    for ax, group in zip(axes, panels):
        for c, n in zip(colors if len(group) > 1 else ["tab:blue"], group):
            ax.plot(times, raw.nvar[n], color=c, lw=2.2, alpha=0.85, label=f"N = {N}" if len(group) == 1 else n)
            ax.plot(times, 2 * big.nvar[n] - raw.nvar[n], color=c, lw=1.0, ls=":", alpha=0.9)
            th, se = prop.var(n), prop.se_var(n)
            ax.fill_between(times, th - 2 * se, th + 2 * se, color="0.6", alpha=0.35, lw=0)
            ax.plot(times, th, **common.THEORY)
    common.label_deep_panels(axes, "var")
    common.finish_row_figure(plt, fig, axes[0], f"Deep tanh network (L = {L}), one point: width N = {N} ensembles "
                             f"(E = {E}; solid, dotted = extrapolated) vs DMFT propagator (dashed, band 2 se)",
                             args.out, "deep_tanh_variance")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
