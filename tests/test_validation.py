"""The solver against real finite-width networks trained by gradient descent.

For each shipped spec, the theory's saddle point and equal-time propagator are
compared with the mean and N*Var of ensembles of width-N networks
(:mod:`dmftc.validation.ensemble`).  Tolerance, pointwise in time and component:

    |theory - ensemble| <= Z * sqrt(se_ensemble^2 + se_theory^2),   Z = 4

* se_ensemble: standard error of the ensemble mean (std/sqrt(E)) or of N*Var
  (from the fourth moment), estimated from the ensemble itself;
* se_theory: Monte Carlo error of the solver, sqrt(var/samples) for means and
  the spread over 8 independent sample groups for variances (Solution.stderr).

Z = 4 makes a false alarm at a single point a ~6e-5 event; seeds are fixed, so
the outcome is deterministic.  The theory is the N -> infinity limit, while a
width-N ensemble carries O(1/N) corrections (to the mean, and to N*Var, where
they stand out wherever the leading term is small) which, relative to the
O(1/sqrt(E)) standard errors, grow with E.  So the ensemble is run at N and 2N
and both statistics are Richardson-extrapolated in 1/N: x = 2 x(2N) - x(N).
Each case also records max|diff| relative to the curve's peak, which the slow suite
holds to the 5% target with four times larger samples and ensembles.
"""
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.validation.truth import finite_width_truth

ROOT = Path(__file__).resolve().parent.parent
Z = 4.0

# name: (spec, parameters, N (the smaller width), E, samples)
CASES = {
    "two_layer": ("two_layer", {}, 256, 4000, 20000),
    "two_layer_multi_lazy": ("two_layer_multi", {"gamma": 0.05, "P": 3, "T": 60, "eta": 0.04}, 512, 3000, 20000),
    "two_layer_multi_rich": ("two_layer_multi", {"gamma": 1.0, "P": 3, "T": 60, "eta": 0.04}, 512, 3000, 20000),
    "linear_whitened": ("linear_whitened", {"P": 3, "T": 60, "eta": 0.04}, 512, 3000, 20000),
    "eos_large_step": ("eos", {"gamma": 1.5, "eta": 0.4, "T": 12}, 256, 4000, 20000),
}


def compare(sol, truth):
    """Largest z-scores and relative differences of means and variances, per order parameter."""
    rows = {}
    for name in sol.names:
        m, v = sol.mean(name), sol.var(name)
        se_m = np.sqrt(truth.mean_se[name] ** 2 + sol.stderr(name, "mean") ** 2)
        se_v = np.sqrt(truth.nvar_se[name] ** 2 + sol.stderr(name) ** 2)
        dm, dv = np.abs(m - truth.mean[name]), np.abs(v - truth.nvar[name])
        # exact agreement (e.g. Delta(0) = y, zero variance at t = 0) has zero error bars
        zm = np.where(dm > 1e-12, dm / np.maximum(se_m, 1e-300), 0.0)
        zv = np.where(dv > 1e-12, dv / np.maximum(se_v, 1e-300), 0.0)
        rows[name] = {"z_mean": zm.max(), "z_var": zv.max(),
                      "mean_rel": dm.max() / np.abs(truth.mean[name]).max(),
                      "var_rel": dv.max() / np.abs(truth.nvar[name]).max()}
    return rows


def run_case(case, scale=1, extrapolate=True):
    spec, params, N, E, samples = CASES[case]
    model = dmftc.load(ROOT / "specs" / f"{spec}.dmft")
    sol = model.solve(samples=samples * scale, seed=11, **params)
    truth = finite_width_truth(spec, sol.params, N=N if extrapolate else 2 * N, E=E * scale, seed=7,
                               extrapolate=extrapolate)
    return sol, compare(sol, truth)


@pytest.mark.parametrize("case", sorted(CASES))
def test_theory_matches_finite_width_networks(case):
    _, rows = run_case(case)
    report = "\n".join(f"{n:>8}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()) for n, r in rows.items())
    print(f"\n{case}\n{report}")
    for name, r in rows.items():
        assert r["z_mean"] <= Z, f"{case}: mean of {name} off by {r['z_mean']:.1f} standard errors\n{report}"
        assert r["z_var"] <= Z, f"{case}: N Var of {name} off by {r['z_var']:.1f} standard errors\n{report}"


@pytest.mark.slow
def test_dropping_relu_delta_terms_is_detectably_wrong():
    """The ReLU's phi'' = sqrt(2) delta(h) matters in rich training: without it (dirac_width=0) the
    kernel variance is biased by many standard errors (measured: ~6% of the peak, z ~ 6 at N = 2048,
    E = 8000); the mollified estimate (default) is not."""
    spec, params, _, _, _ = CASES["two_layer_multi_rich"]
    model = dmftc.load(ROOT / "specs" / f"{spec}.dmft")
    truth = finite_width_truth(spec, model.solve(samples=2, T=1).params | params, N=2048, E=8000, seed=7)
    dropped = model.solve(samples=40000, seed=11, dirac_width=0.0, **params)
    mollified = model.solve(samples=40000, seed=11, **params)
    assert compare(dropped, truth)["K"]["z_var"] > Z
    assert compare(mollified, truth)["K"]["z_var"] <= Z


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_five_percent_target_with_large_ensembles(case):
    """Paper-scale check of the issue's target: max |diff| below 5% of the curve's peak, against one
    width-2N ensemble four times larger (standard error ~1% of the peak, no extrapolation noise)."""
    _, rows = run_case(case, scale=4, extrapolate=False)
    for name, r in rows.items():
        assert r["var_rel"] < 0.05 and r["mean_rel"] < 0.05, (case, name, r)
