"""ReLU networks in rich training (issue 13, open): how far the propagator of a kinked activation is from
finite-width networks, and why smoothing the activation does not fix it.  Reported, not asserted.

Spec two_layer_multi (sqrt(2) relu) on P random points (Gram matrix of P random vectors in D = 8, targets of both
signs from a standard normal), gamma of order one.  Three measurements per case:

(a) dmftc's propagator (exact relu in the saddle-point march; phi'' = sqrt(2) delta(h) replaced by a Gaussian of
    width dirac_width = 0.1 in the sensitivities) against width-N relu networks (dmftc.validation.ensemble), N and
    2N, Richardson in 1/N: max |theory - networks| relative to each order parameter's peak and pointwise z, for
    N Var Delta and N Var K, and for the means.
(b) Chattering at the kink: one wide relu network (N = 20000 neurons) trained by the same gradient descent; the
    fraction of neurons whose preactivation h_mu changes sign at least 3 times (and 6 times) during training.
    Pushes of opposite sign from different points hold such neurons at h_mu = 0, where they cross the kink back
    and forth every step or two.
(c) Smoothing the activation changes that dynamics: networks with the relu replaced by its Gaussian convolution
    of width w, sqrt(2) (h Phi(h / w) + w phi(h / w)), trained from the SAME initialisations as the relu networks
    (common random numbers): max |<K>_w - <K>_relu| relative to the peak, for w = 0.1 ... 0.001.  They agree only
    once w is below the size of one gradient step of h, far below any width at which a Monte Carlo estimate of the
    sensitivities (variance ~ 1 / w) is usable; so a consistent smoothing of the activation in the whole model
    with an extrapolation w -> 0 has no asymptotic regime to extrapolate from (tried: the smoothed DMFT's mean K
    moved away from the networks as w shrank, and was reverted).

    python experiments/relu_rich.py [--quick] [--out DIR]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.ensemble import simulate_two_layer  # noqa: E402

D_IN, SEED = 8, 1300
NAMES = ("Delta", "K")
WIDTHS = (0.1, 0.03, 0.01, 0.003, 0.001)


def data(P, case):
    """Random Gram matrix from P vectors in D_IN dimensions and targets of both signs."""
    rng = np.random.default_rng(SEED + 17 * P + case)
    X = rng.standard_normal((P, D_IN))
    y = rng.standard_normal(P)
    if np.all(y > 0) or np.all(y < 0):
        y[0] = -y[0]
    return X @ X.T / D_IN, y


def chatter(Kx, y, gamma, eta, T, N=20000, seed=0):
    """Per point, the fractions of the neurons of one width-N relu network whose preactivation changes sign at
    least 3 and at least 6 times in T steps of gradient descent (same updates as dmftc.validation.ensemble)."""
    rng = np.random.default_rng(seed)
    P = len(y)
    h = rng.standard_normal((N, P)) @ np.linalg.cholesky(Kx + 1e-12 * np.eye(P)).T
    a = rng.standard_normal(N)
    relu = lambda x: np.sqrt(2) * np.maximum(x, 0.0)                  # noqa: E731
    f0 = a @ relu(h) / (gamma * N)
    flips, side = np.zeros((N, P), int), h > 0
    for _ in range(T):
        delta = y - (a @ relu(h) / (gamma * N) - f0)
        g = np.sqrt(2) * (h > 0) * a[:, None]
        h, a = h + eta * gamma * (g * delta) @ Kx, a + eta * gamma * relu(h) @ delta
        flips += (h > 0) != side
        side = h > 0
    return (flips >= 3).mean(axis=0), (flips >= 6).mean(axis=0)


def smoothed(w):
    """The Gaussian convolution of sqrt(2) max(0, h) at width w, as an expression for the simulators."""
    return f"sqrt(2) * (h * (1 + erf(h / (sqrt(2) * {w}))) / 2 + {w} * exp(-h^2 / (2 * {w}^2)) / sqrt(2 * pi))"


def main():
    args = common.parse_args("relu_rich", __doc__)
    if args.quick:
        cases, T, eta, N, E, samples, E_smooth = [(0.5, 3), (1.0, 2)], 40, 0.05, 128, 6000, 8000, 2000
    else:
        cases, T, eta, N, E, samples, E_smooth = [(g, P) for P in (3, 4, 8) for g in (0.25, 0.5, 1.0)], 100, 0.02, \
            256, 40000, 32000, 4000
    agree = common.Agreement("relu_rich", args.quick)
    agree.meta.update(spec="two_layer_multi", D=D_IN, T=T, eta=eta, widths=[N, 2 * N], E=E, samples=samples,
                      cases=cases, dirac_width=0.1, smoothing_widths=WIDTHS, E_smooth=E_smooth)
    model = dmftc.load(common.SPECS / "two_layer_multi.dmft")
    plt = common.pyplot()
    fig, axes = plt.subplots(len(cases), 3, figsize=(15, 3.4 * len(cases)), squeeze=False)
    arrays, report = {}, {}
    for row, (gamma, P) in enumerate(cases):
        Kx, y = data(P, row)
        seed = SEED + 100 * row
        label = f"gamma={gamma:g} P={P}"
        sol = model.solve(P=P, Kx=Kx, y=y, gamma=gamma, T=T, eta=eta, samples=samples, seed=seed)
        runs = [simulate_two_layer(activation="relu", Kx_all=Kx, y=y, gamma=gamma, eta=eta, T=T, N=n, E=E,
                                   seed=seed + k + 1) for k, n in enumerate((N, 2 * N))]
        rep = {}
        for n in NAMES:
            ext, ext_se = common.richardson(runs[0].nvar[n], runs[0].nvar_se[n], runs[1].nvar[n], runs[1].nvar_se[n])
            mext, mext_se = common.richardson(runs[0].mean[n], runs[0].mean_se[n], runs[1].mean[n],
                                              runs[1].mean_se[n])
            note = "issue 13 (open): relu sensitivities through chattering neurons"
            agree.add(f"{label} N Var({n})", sol.var(n), sol.stderr(n), ext, ext_se, raw=runs[0].nvar[n],
                      check=False, note=note)
            agree.add(f"{label} <{n}>", sol.mean(n), sol.stderr(n, "mean"), mext, mext_se, raw=runs[0].mean[n],
                      check=False, note=note)
            rep[f"N Var {n} combined se / peak"] = float(np.sqrt(sol.stderr(n) ** 2 + ext_se ** 2).max()
                                                         / np.abs(ext).max())
            arrays.update({f"{label} theory {n}": sol.var(n), f"{label} theory_se {n}": sol.stderr(n),
                           f"{label} ensemble {n}": runs[0].nvar[n], f"{label} extrap {n}": ext,
                           f"{label} extrap_se {n}": ext_se})
        c3, c6 = chatter(Kx, y, gamma, eta, T, seed=seed)
        rep["chattering (>= 3 sign changes) per point"] = c3
        rep["chattering (>= 6 sign changes) per point"] = c6
        relu_nets = simulate_two_layer(activation="relu", Kx_all=Kx, y=y, gamma=gamma, eta=eta, T=T, N=N,
                                       E=E_smooth, seed=seed + 7)
        peak = np.abs(relu_nets.mean["K"]).max()
        gap = []
        for w in WIDTHS:
            nets = simulate_two_layer(activation=smoothed(w), Kx_all=Kx, y=y, gamma=gamma, eta=eta, T=T, N=N,
                                      E=E_smooth, seed=seed + 7)
            gap.append(float(np.abs(nets.mean["K"] - relu_nets.mean["K"]).max() / peak))
        rep["smoothed vs relu networks, max |<K>_w - <K>| / peak"] = dict(zip(map(str, WIDTHS), gap))
        report[label] = rep
        t = sol.times
        ax = axes[row]
        for mu in range(P):
            c = f"C{mu % 10}"
            ax[0].plot(t, runs[0].nvar["Delta"][mu], color=c, lw=1.6, alpha=0.7)
            ax[0].plot(t, arrays[f"{label} extrap Delta"][mu], color=c, lw=0.8, ls=":")
            ax[0].plot(t, sol.var("Delta")[mu], **common.THEORY)
        for k, (mu, nu) in enumerate([(0, 0), (0, 1), (P - 1, P - 1)]):
            c = f"C{k}"
            ax[1].plot(t, runs[0].nvar["K"][mu, nu], color=c, lw=1.6, alpha=0.7, label=f"K[{mu + 1},{nu + 1}]")
            ax[1].plot(t, arrays[f"{label} extrap K"][mu, nu], color=c, lw=0.8, ls=":")
            ax[1].plot(t, sol.var("K")[mu, nu], **common.THEORY)
        ax[2].loglog(WIDTHS, gap, "o-", label="smoothed vs relu networks, <K>")
        ax[2].axhline(rep["N Var K combined se / peak"], color="0.6", lw=0.8, label="N Var K: combined se / peak")
        ax[0].set(title=f"{label}: N Var Delta_mu", xlabel="t")
        ax[1].set(title=f"{label}: N Var K (some entries)", xlabel="t")
        ax[2].set(title=f"chattering neurons: {', '.join(f'{x:.0%}' for x in c3)}", xlabel="smoothing width w",
                  ylabel="max |difference| / peak")
        ax[1].legend(fontsize=7)
        ax[2].legend(fontsize=7)
    agree.meta["report"] = report
    np.savez_compressed(args.out / "relu_rich.npz", **{k.replace(" ", "_"): v for k, v in arrays.items()})
    common.finish_row_figure(plt, fig, axes[0, 0], "sqrt(2)-ReLU, rich training: dmftc (dashed) vs networks (solid N, "
                             "dotted extrapolated); right: smoothing the relu changes the network", args.out,
                             "relu_rich")
    for label, rep in report.items():
        print(f"  {label}: chattering {np.round(rep['chattering (>= 3 sign changes) per point'], 3)}, smoothed vs "
              f"relu <K>: {rep['smoothed vs relu networks, max |<K>_w - <K>| / peak']}")
    agree.finish(args.out)


if __name__ == "__main__":
    main()
