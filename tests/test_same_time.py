"""Order parameters defined from others at the same time (a constraint reading earlier-declared scalars), e.g.
the rate r(t) = -log(Delta(t) / y) of specs/rates.dmft: the march evaluates them in declaration order, U gets
the same-time partials, and the propagator and the O(1/N) mean correction follow the delta method exactly."""
from pathlib import Path

import numpy as np
import pytest

import dmftc

ROOT = Path(__file__).resolve().parent.parent

EOS_RATE = (ROOT / "specs" / "eos.dmft").read_text().replace(
    "order Delta(t), K(t)", "order Delta(t), K(t), rate(t)").replace(
    "hat K(t) K(t), t)", "hat K(t) K(t) + hat rate(t) (rate(t) + log(Delta(t) / y)), t)")


def _check_delta_method(sol, exact, r="r"):
    """Delta method: r = -log(Delta / y) gives Sigma_rr = Sigma / Delta^2, Sigma_r,Delta = -Sigma / Delta and
    m1_r = -m1_Delta / Delta + Sigma(t, t) / (2 Delta^2).  The propagator identities hold to round-off per
    solve (Monte Carlo: per group, then averaged: to O(1/samples)); m1 is a Monte Carlo estimate from the
    sampled paths' own E[v v^T], so it is compared within 4 of its standard errors."""
    tol = 1e-9 if exact else 1e-2
    d, S = sol.mean("Delta"), sol.sigma("Delta", "Delta")
    np.testing.assert_allclose(sol.mean(r), -np.log(d), rtol=tol)
    np.testing.assert_allclose(sol.sigma(r, r), S / np.outer(d, d), rtol=tol, atol=1e-12)
    np.testing.assert_allclose(sol.sigma(r, "Delta"), -S / d[:, None], rtol=tol, atol=1e-12)
    m1_r = -sol.mean_correction("Delta") / d + 0.5 * np.diag(S) / d ** 2
    got, se = sol.mean_correction(r), sol.mean_correction(r, stderr=True)
    assert np.abs(got).max() > 5 * se.max()                      # resolved: the comparison can fail
    ok = se > 1e-9 * se.max()
    z = np.abs(got - m1_r)[ok] / se[ok]
    assert z.max() <= 4, z.round(2)
    assert np.all(np.abs(got - m1_r)[~ok] <= 1e-10)


def test_rates_spec_monte_carlo():
    sol = dmftc.load(ROOT / "specs" / "rates.dmft").solve(T=25, eta=0.08, samples=6000, groups=4, correction=True)
    _check_delta_method(sol, exact=False)


def test_same_time_constraint_exact_backend(tmp_path):
    spec = tmp_path / "eos_rate.dmft"
    spec.write_text(EOS_RATE)
    m = dmftc.load(spec, out_dir=tmp_path)
    sol = m.solve(gamma=1.5, eta=0.1, T=8, backend="exact", correction=True, samples=40000)
    _check_delta_method(sol, exact=True, r="rate")
    # the rest of the model is untouched by the extra order parameter
    ref = dmftc.load(ROOT / "specs" / "eos.dmft").solve(gamma=1.5, eta=0.1, T=8, backend="exact")
    np.testing.assert_allclose(sol.sigma("Delta", "K"), ref.sigma("Delta", "K"), rtol=1e-10, atol=1e-12)


def test_derive_prints_the_same_time_block(capsys):
    from dmftc.cli import main

    assert main(["derive", str(ROOT / "specs" / "rates.dmft")]) == 0
    out = capsys.readouterr().out
    assert "r(t) + log(Delta(t)/y) = 0" in out
    assert "U[r, Delta](t, s) = 1/Delta(t) delta(t,s)" in out


@pytest.mark.parametrize("text, message", [
    (EOS_RATE.replace("order Delta(t), K(t), rate(t)", "order rate(t), Delta(t), K(t)"), "couples it to Delta"),
])
def test_order_matters(tmp_path, text, message):
    from dmftc.errors import SpecError

    spec = tmp_path / "bad.dmft"
    spec.write_text(text)
    with pytest.raises(SpecError, match=message):
        dmftc.load(spec, out_dir=tmp_path)
