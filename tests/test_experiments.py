"""The figure scripts in experiments/: each runs in --quick mode and asserts its own agreement.

The scripts exit non-zero when theory and Richardson-extrapolated finite-width
ensembles disagree by more than 4 combined standard errors, so these tests (part of
the default suite, about 3 minutes together) fail if a figure drifts.  The fast test checks that the helpers the scripts use
for derived observables reproduce dmftc.validation.truth exactly.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))
import common  # noqa: E402

SCRIPTS = ("fig2_lazy", "fig3_two_layer", "fig4_whitened", "fig5_deep_linear", "fig6_eos", "deep_activations",
           "mean_correction", "bias_variance", "kappa_D_gamma", "deep_linear_correction", "two_time_deep_linear",
           "online_learning", "rates")   # each writes <name>.png / .npz
SLOW_SCRIPTS = ("deep_tanh_variance", "deep_tanh_means")   # deep propagator compile; big ensembles


@pytest.mark.parametrize("script", SCRIPTS + tuple(pytest.param(s, marks=pytest.mark.slow) for s in SLOW_SCRIPTS))
def test_figure_script_quick(script, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{script}.py"), "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    png, summary = tmp_path / f"{script}.png", tmp_path / "summary.json"
    assert png.exists() and png.stat().st_size > 10_000
    assert summary.exists() and (tmp_path / f"{script}.npz").exists()
    s = json.loads(summary.read_text())
    assert s["passed"] and s["mode"] == "quick" and s["max_z_checked"] <= common.Z_MAX


def test_helpers_reproduce_finite_width_truth():
    """richardson / sample_stats on simulate_two_layer runs at (N, seed), (2N, seed + 1) equal
    finite_width_truth(..., extrapolate=True), which fig2 and fig4 rely on."""
    from dmftc.validation.ensemble import simulate_two_layer
    from dmftc.validation.truth import finite_width_truth

    P, N, E, seed = 3, 16, 40, 5
    params = {"P": P, "y": np.full(P, 1 / np.sqrt(P)), "gamma": 1.0, "eta": 0.05, "T": 6}
    ref = finite_width_truth("linear_whitened", params, N=N, E=E, seed=seed, extrapolate=True)
    runs = [simulate_two_layer(activation="linear", Kx_all=np.eye(P), y=params["y"], gamma=1.0, eta=0.05, T=6,
                               N=n, E=E, seed=s, keep_samples=True) for n, s in ((N, seed), (2 * N, seed + 1))]
    for k in ("mean", "nvar"):
        x, se = common.richardson(getattr(runs[0], k)["Delta"], getattr(runs[0], k + "_se")["Delta"],
                                  getattr(runs[1], k)["Delta"], getattr(runs[1], k + "_se")["Delta"])
        np.testing.assert_allclose(x, getattr(ref, k)["Delta"], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(se, getattr(ref, k + "_se")["Delta"], rtol=1e-12, atol=1e-14)
    for run, n in zip(runs, (N, 2 * N)):
        m, v, m_se, v_se = common.sample_stats(run.samples["Delta"], n)
        for mine, theirs in zip((m, v, m_se, v_se), (run.mean, run.nvar, run.mean_se, run.nvar_se)):
            np.testing.assert_allclose(mine, theirs["Delta"], rtol=1e-10, atol=1e-14)
        tot, _ = common.total_nvar_stats(run.samples["Delta"], n)
        np.testing.assert_allclose(tot, run.nvar["Delta"].sum(axis=0), rtol=1e-10, atol=1e-14)
