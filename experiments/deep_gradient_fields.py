"""Deep networks whose backward signal is not phi'(h) z: a surrogate derivative and an extra term, L = 2, one point.

The spec is ``specs/deep_tanh.dmft`` with its activation line and its gradient field line replaced:

* surrogate: phi(h) = tanh(h), g = z / (1 + h^2) (a surrogate derivative in place of phi'), gamma = 1, y = 0.7;
* extra: phi(h) = sin(h), g = cos(h) z + 0.25 sin(h) (the true derivative plus a term b(h)), gamma = 1.5,
  y = -0.6.

dmftc derives the coefficients a, b of g = a(h) z + b(h) and their derivatives from the spec; the means come from
the spec's march and the finite-width variances from the deep propagator.  Ground truth: width-N networks whose
backward pass uses the same signal (dmftc.validation.deep_ensemble.simulate_deep given the spec's activation),
Richardson-extrapolated in 1/N from widths N and 2N.  Panels per case (rows): N Var Delta(t), N Var K(t),
N Var Phi[l](t,t), N Var G[l](t,t).

Agreement (asserted): pointwise z <= 4 for the means and the N Var of Delta, K, Phi[1], Phi[2], G[1], G[2]; in full
mode also max_t |theory - ensemble| within 5% of each N Var curve's peak.

    python experiments/deep_gradient_fields.py [--quick] [--out DIR]

Full mode (T = 10, eta = 0.1; 64000 paths for the means, 65536 source paths for the propagator in 8 groups;
N = 128 and 256, E = 40000 networks per width) takes about 4 minutes on 2 cores; the same comparison is the slow
test tests/test_deep_gradient_field.py::test_nonstandard_gradient_fields_match_networks.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # the simulator runs its own 2 threads

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dmftc  # noqa: E402
from dmftc.runtime.march.deep_dmft import SpecKernels  # noqa: E402
from dmftc.validation.deep_ensemble import simulate_deep  # noqa: E402

L, SEED, REL_MAX = 2, 1300, 0.05
GD = "g[l](t) = phi'(h[l](t)) z[l](t)"
CASES = {   # name: (activation, gradient field line, gamma, y)
    "surrogate": ("tanh(h)", "g[l](t) = z[l](t) / (1 + h[l](t)^2)", 1.0, 0.7),
    "extra": ("sin(h)", "g[l](t) = cos(h[l](t)) z[l](t) + 0.25 * sin(h[l](t))", 1.5, -0.6),
}


def spec_with_gradient(name: str, act: str, gline: str, out: Path) -> Path:
    """specs/deep_tanh.dmft with its model name, activation and gradient field replaced."""
    text = (common.SPECS / "deep_tanh.dmft").read_text()
    for old, new in (("activation phi(h) = tanh(h)", f"activation phi(h) = {act}"), (GD, gline),
                     ("model deep_tanh ", f"model deep_{name} ")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = out / f"deep_{name}.dmft"
    path.write_text(text)
    return path


def main():
    args = common.parse_args("deep_gradient_fields", __doc__)
    if args.quick:
        T, eta, samples, paths, groups, N, E = 4, 0.2, 16000, 8192, 8, 128, 4000
    else:
        T, eta, samples, paths, groups, N, E = 10, 0.1, 64000, 65536, 8, 128, 40000
    agree = common.Agreement("deep_gradient_fields", args.quick)
    agree.meta.update(L=L, T=T, eta=eta, samples=samples, propagator_samples=paths, propagator_groups=groups,
                      widths=[N, 2 * N], E=E, cases={k: {"activation": a, "g": g, "gamma": gm, "y": y}
                                                     for k, (a, g, gm, y) in CASES.items()})
    names = ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    times = eta * np.arange(T)
    arrays, curves = {}, {}
    for k, (case, (act, gline, gamma, y)) in enumerate(CASES.items()):
        m = dmftc.load(spec_with_gradient(case, act, gline, args.out), args.out)
        kw = dict(L=L, gamma=gamma, y=y, eta=eta, T=T)
        sol = m.solve(samples=samples, groups=8, propagator_samples=paths, propagator_groups=groups,
                      seed=SEED + 10 * k, **kw)
        site = SpecKernels(m.module).site_activation(m.module.defaults(dict(kw)), 0.0)   # carries the spec's g
        raw = simulate_deep(activation=site, N=N, E=E, seed=SEED + 10 * k + 1, **kw)
        big = simulate_deep(activation=site, N=2 * N, E=E, seed=SEED + 10 * k + 2, **kw)
        common.add_deep_ensembles(agree, case, sol, raw, big, names, curves, arrays)
        agree.meta[f"{case}_ensemble_se_over_peak"] = max(
            float(np.max(curves[(case, n)][4]) / np.max(np.abs(curves[(case, n)][3]))) for n in names)
    np.savez_compressed(args.out / "deep_gradient_fields.npz", times=times, **arrays)

    plt = common.pyplot()
    rows = {case: f"phi = {act}, {gline.split('= ', 1)[1]}" for case, (act, gline, _, _) in CASES.items()}
    common.plot_deep_rows(plt, rows, curves, times, L=L, N=N, E=E,
                          what="trained with other backward signals", out=args.out, name="deep_gradient_fields")
    common.finish_deep(agree, args.out, REL_MAX)


if __name__ == "__main__":
    main()
