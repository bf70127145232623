"""A deep network trained on several points: the finite-width variances of specs/deep_multi.dmft (squared loss)
and specs/deep_logistic.dmft (logistic loss) against networks.

The spec is the deep tanh network written with a point index (``index mu, nu in 1..P``), which dmftc folds into
time; its Monte Carlo propagator (the Hessian of the folded action over the T P (time, point) steps, causal by
time) gives lim N Var of the error signal Delta_mu(t) of every point and of the NTK K_{mu nu}(t) and the
equal-time kernels Phi[l]_{mu nu}(t, t), G[l]_{mu nu}(t, t) of every pair.  Here P = 3 points of a random Gram
matrix (inputs in D = 8 dimensions) with targets of both signs, L = 2 hidden layers, gamma = 1.  The second row
trains the same network on the logistic loss ln(1 + exp(-y f)) with labels of both signs and sizes: its error
signal y / (1 + exp(y f)) is nonlinear in the output, and the propagator sees it through its slope at the saddle,
step by step (dmftc.runtime.problem.deep_model.DeepModel.linearised).  The third row trains on the first two points only
(update mask m = 1, 1, 0): the third is a test point, whose Delta is the test error y - f.  Ground truth:
depth-L networks trained on the same points by gradient descent on the same loss (dmftc.validation.deep_ensemble.
simulate_deep with Kx, y and, for the logistic loss, error_signal; for the test point, trained), N Var
Richardson-extrapolated in 1/N from widths N and 2N.

Agreement (asserted): pointwise z <= 4 for N Var of Delta, K, Phi[l](t, t), G[l](t, t) of every point and pair;
in full mode also within 5% of each quantity's peak.

    python experiments/deep_points_variance.py [--quick] [--out DIR]

Full mode (T = 8, eta = 0.1; propagator 16000 source paths in 8 groups; N = 256 and 512, E = 30000 networks per
width) takes 12-19 minutes on 2 cores (713 s on 2026-11-28); the quick mode (T = 4, N = 128/256, E = 2000) is a
smoke run (the default suite's tests/test_deep_points.py and tests/test_deep_losses.py make the same comparisons
at smaller sizes).
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

L, P, GAMMA, SEED, REL_MAX = 2, 3, 1.0, 1500, 0.05


def main():
    args = common.parse_args("deep_points_variance", __doc__)
    if args.quick:
        T, eta, samples, N, E = 4, 0.1, 2000, 128, 2000
    else:
        T, eta, samples, N, E = 8, 0.1, 16000, 256, 30000
    rng = np.random.default_rng(SEED)
    Z = rng.standard_normal((P, 8))
    Kx = Z @ Z.T / 8
    losses = {"squared": ("deep_multi.dmft", np.array([0.8, -0.5, 0.3]), None, None),
              "logistic": ("deep_logistic.dmft", np.array([1.25, -1.9, -1.0]),
                           lambda f, y: y / (1 + np.exp(y * f)), None),
              "test point": ("deep_multi.dmft", np.array([0.8, -0.5, 0.3]), None, np.array([1.0, 1.0, 0.0]))}
    agree = common.Agreement("deep_points_variance", args.quick)
    agree.meta.update(L=L, P=P, T=T, eta=eta, gamma=GAMMA, propagator_samples=samples, widths=[N, 2 * N], E=E,
                      Kx=Kx.tolist(), targets={k: v[1].tolist() for k, v in losses.items()})
    names = ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]
    shown = ["Delta", "K", "Phi[2]", "G[1]"]
    plt = common.pyplot()
    fig, axes = plt.subplots(len(losses), len(shown), figsize=(4.0 * len(shown), 3.4 * len(losses)))
    arrays, times = {}, eta * np.arange(T)
    for row, (loss, (spec, y, error_signal, mask)) in enumerate(losses.items()):
        kw = dict(L=L, gamma=GAMMA, y=y, eta=eta, T=T, Kx=Kx)
        sol = dmftc.load(common.SPECS / spec, args.out).solve(
            P=P, samples=16000, propagator_samples=samples, propagator_groups=8, seed=SEED,
            **kw, **({} if mask is None else {"m": mask}))
        net = dict(error_signal=error_signal, trained=mask, **kw)
        raw = simulate_deep(activation="tanh", N=N, E=E, seed=SEED + 1, **net)
        big = simulate_deep(activation="tanh", N=2 * N, E=E, seed=SEED + 2, **net)
        curves = {}
        for n in names:
            th, th_se = sol.var(n), sol.var_stderr(n)
            ens, ens_se = common.richardson(raw.nvar[n], raw.se_nvar[n], big.nvar[n], big.se_nvar[n])
            agree.add(f"{loss}: N Var {n}", th, th_se, ens, ens_se, raw=raw.nvar[n])
            curves[n] = (th, th_se, ens, ens_se)
            arrays.update({f"{loss}:theory:{n}": th, f"{loss}:theory_se:{n}": th_se, f"{loss}:ensemble:{n}": ens,
                           f"{loss}:ensemble_se:{n}": ens_se})
        agree.meta[f"propagator ({loss})"] = {k: v for k, v in sol.info.items() if k.startswith("propagator_")}
        prefix = "test point 3: N Var " if mask is not None else f"{loss} loss: N Var "
        common.point_panels(axes[row], times, {n: curves[n] for n in shown}, prefix=prefix)
    np.savez_compressed(args.out / "deep_points_variance.npz", times=times, **arrays)
    fig.suptitle(f"deep tanh network (L = {L}) on P = {P} points, squared and logistic loss, and a test point: N Var, "
                 f"theory (dashed, 2 se; {samples} paths) against networks (points, N = {N}/{2 * N} extrapolated, "
                 f"E = {E})", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    common.save_figure(fig, args.out, "deep_points_variance")
    common.finish_deep(agree, args.out, REL_MAX)


if __name__ == "__main__":
    main()
