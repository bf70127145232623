"""Deep networks with activations dmftc has never seen: sin(h) and softsign h / (1 + |h|), L = 2, one point.

The spec is ``specs/deep_tanh.dmft`` with its activation line replaced (nothing else changes), compiled and
solved through ``dmftc.load``: the means come from the spec's march and the finite-width variances from the
deep propagator driven by the generated activation and its four SymPy-printed derivatives.  Ground truth:
ensembles of width-N networks with the same activation trained by discrete gradient descent
(dmftc.validation.deep_ensemble), Richardson-extrapolated in 1/N from widths N and 2N.

Panels per activation (rows): N Var Delta(t), N Var K(t), N Var Phi[l](t,t), N Var G[l](t,t).

Agreement (asserted): pointwise z = |theory - ensemble| / sqrt(se_theory^2 + se_ensemble^2) <= 4 for the means
and the N Var of Delta, K, Phi[1], Phi[2], G[1], G[2]; in full mode also max_t |theory - ensemble| within 5% of
each N Var curve's peak.  Softsign's third derivative holds a delta function (phi'' jumps at 0), replaced by a
Gaussian of width dirac_width = 0.1 in the propagator, which is then extrapolated to width 0 from widths 0.1
and 0.05 on the same paths (dmftc.runtime.engines.deep_propagator); the script reports the size of that correction.

    python experiments/deep_activations.py [--quick] [--out DIR] [--paths N] [--E E] [--only sin|softsign]

Full mode (T = 30, eta = 0.05, gamma = 1; 128000 paths for the means; randomised quasi-Monte Carlo source paths
for the propagator (dmftc.runtime.numerics.sampling): sin 16384 in 8 groups of 2^11, softsign 65536 in 16 groups of 2^12;
E = 100000 networks per width, so that the extrapolated ensembles' standard error is about 1% of each peak) takes
about 75 minutes on 2 cores.  Softsign needs the larger budget: its propagator's per-group values are heavy-tailed
(the mollified delta function), so that 8 groups of 2^11 under-estimated its standard error at late times
(2026-11-29: N Var G[1] at t = 27 with se 0.00012 from 16384 paths, 0.00034 from 65536 on the same seed).
"""
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # the simulator runs its own 2 threads

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.validation.deep_ensemble import simulate_deep  # noqa: E402

L, GAMMA, Y, SEED, REL_MAX = 2, 1.0, 1.0, 1100, 0.05
ACTIVATIONS = {"sin": "sin(h)", "softsign": "h / (1 + abs(h))"}
FULL_PATHS = {"sin": (16384, 8), "softsign": (65536, 16)}     # propagator source paths, groups (full mode)


def spec_with_activation(name: str, expr: str, out: Path) -> Path:
    """specs/deep_tanh.dmft with only the model name and the activation line replaced."""
    text = (common.SPECS / "deep_tanh.dmft").read_text()
    text, n = re.subn(r"(?m)^activation phi\(h\) = .*$", f"activation phi(h) = {expr}", text)
    text = re.sub(r"(?m)^model deep_tanh ", f"model deep_{name} ", text)
    assert n == 1
    path = out / f"deep_{name}.dmft"
    path.write_text(text)
    return path


def main():
    def options(ap):
        ap.add_argument("--paths", type=int, default=None, help="source paths of the propagator (default: by mode)")
        ap.add_argument("--only", choices=sorted(ACTIVATIONS), default=None, help="one activation only")
        ap.add_argument("--E", type=int, default=None, help="networks per width (default: by mode)")

    args = common.parse_args("deep_activations", __doc__, options)
    acts = {k: v for k, v in ACTIVATIONS.items() if args.only in (None, k)}
    if args.quick:
        T, eta, samples, N, E = 6, 0.1, 64000, 128, 3000
        budget = {act: (1024, 8) for act in acts}
    else:
        T, eta, samples, N, E = 30, 0.05, 128000, 256, 100000
        budget = {act: FULL_PATHS[act] for act in acts}
    if args.paths:
        budget = {act: (args.paths, groups) for act, (_, groups) in budget.items()}
    E = args.E or E
    agree = common.Agreement("deep_activations", args.quick)
    agree.meta.update(L=L, gamma=GAMMA, y=Y, T=T, eta=eta, samples=samples,
                      propagator_samples={act: b[0] for act, b in budget.items()},
                      propagator_groups={act: b[1] for act, b in budget.items()}, propagator_sampler="sobol",
                      widths=[N, 2 * N], E=E, activations=acts)
    names = ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    times = eta * np.arange(T)
    arrays, curves, flags = {}, {}, {}
    for k, (act, expr) in enumerate(ACTIVATIONS.items()):
        if act not in acts:
            continue
        spec = spec_with_activation(act, expr, args.out)
        m = dmftc.load(spec, args.out)
        paths, groups = budget[act]
        sol = m.solve(L=L, gamma=GAMMA, y=Y, eta=eta, T=T, samples=samples, groups=16, propagator_samples=paths,
                      propagator_groups=groups, seed=SEED + 10 * k)
        sol.var("K")                        # computes the propagator (and its delta-width extrapolation, if any)
        flags[act] = {k: sol.info.get(k) for k in ("kink_order", "approximation", "dirac_shift", "dirac_shift_vs_se")}
        kw = dict(activation=expr, L=L, gamma=GAMMA, y=Y, eta=eta, T=T, E=E)
        raw = simulate_deep(N=N, seed=SEED + 10 * k + 1, **kw)
        big = simulate_deep(N=2 * N, seed=SEED + 10 * k + 2, **kw)
        common.add_deep_ensembles(agree, act, sol, raw, big, names, curves, arrays)
        agree.meta[f"{act}_ensemble_se_over_peak"] = max(
            float(np.max(curves[(act, n)][4]) / np.max(np.abs(curves[(act, n)][3]))) for n in names)
        agree.meta[f"{act}_theory_se_over_peak"] = max(
            float(np.max(curves[(act, n)][1]) / np.max(np.abs(curves[(act, n)][3]))) for n in names)
    np.savez_compressed(args.out / "deep_activations.npz", times=times, **arrays)

    plt = common.pyplot()
    common.plot_deep_rows(plt, {act: ACTIVATIONS[act] for act in acts}, curves, times, L=L, N=N, E=E,
                          what="with new activations", out=args.out, name="deep_activations")
    common.finish_deep(agree, args.out, REL_MAX, flags=flags)


if __name__ == "__main__":
    main()
