"""Fields in recurrence form, per-step parameters and time as a value (two-layer specs): located errors for what
is not causal, and equal numbers for equal dynamics written in different forms."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.derive import derive
from dmftc.errors import CausalitySpecError, ParameterError, SpecError, StructureSpecError
from dmftc.frontend.check import check
from dmftc.frontend.parse import parse

ROOT = Path(__file__).resolve().parents[1]
SGD = (ROOT / "specs" / "two_layer_sgd.dmft").read_text()
PLAIN = (ROOT / "specs" / "two_layer.dmft").read_text()
VH = "vh(t) = beta * vh(t - 1) + Delta(t) * g(t) - lam / gamma * h(t)"
VZ = "vz(t) = beta * vz(t - 1) + Delta(t) * phi(h(t)) - lam / gamma * z(t)"


def _mutate(text, *edits):
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def _line_col(text, needle, after=None):
    i = text.index(needle, text.index(after) if after else 0)
    return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


CASES = [
    # (id, base text, edits, error class, offending text, after, message)
    ("reads-t-plus-1", SGD, ((VH, VH.replace("beta * vh(t - 1)", "beta * vh(t + 1)")),), CausalitySpecError,
     "vh(t + 1)", "vh(t) =", "reads vh(t + 1), a later time: not causal"),
    ("own-value-at-t", SGD, ((VH, VH.replace("beta * vh(t - 1)", "beta * vh(t)")),), CausalitySpecError,
     "vh(t) +", "beta *", "'vh(t)' on its own right side"),
    ("same-time-cycle", SGD, ((VH, VH + " + vz(t)"), (VZ, VZ + " + vh(t)")), CausalitySpecError,
     "vh(t)", "vz(t) =", "recurrences read each other at the same time: vh(t) -> vz(t) -> vh(t)"),
    ("late-initial-time", SGD, (("vh(-1) = 0", "vh(0) = 0"),), StructureSpecError,
     "vh(0) = 0", None, "the initial value of 'vh' must be given at t = -1"),
    ("early-initial-time", SGD, (("h(0) = u", "h(-1) = u"),), StructureSpecError,
     "h(-1) = u", None, "the initial value of 'h' must be given at t = 0"),
    ("field-reads-late", SGD, (("g(t) = phi'(h(t)) * z(t)", "g(t) = phi'(h(t)) * z(t) * vz(t)"),),
     CausalitySpecError, "vz(t)", "g(t) =", "the field 'g' reads vz(t), which is known only at the end"),
    ("past-without-recurrence", SGD, (("g(t) = phi'(h(t)) * z(t)", "g(t) = phi'(h(t)) * z(t - 1)"),),
     CausalitySpecError, "z(t - 1)", "g(t) =", "'z(t - 1)' in the field 'g', which is not a recurrence"),
    ("per-step-later", SGD, (("lr[t - 1] * vh", "lr[t + 1] * vh"),), CausalitySpecError,
     "lr[t + 1]", None, "'lr[t+1]' reads a later step"),
    ("time-in-integrand", PLAIN, (("integral(Delta(s) * g(s), s < t)", "integral(t * Delta(s) * g(s), s < t)"),),
     SpecError, "t * Delta", None, "cannot be used as a value here inside an integral over s"),
    ("integral-in-recurrence", SGD, ((VH, VH + " + integral(Delta(s), s < t)"),), StructureSpecError,
     "integral(Delta(s)", None, "'vh' is a recurrence"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_located_errors(case):
    _, base, edits, cls, at, after, message = case
    text = _mutate(base, *edits)
    with pytest.raises(SpecError) as info:
        derive(check(parse(text, "specs/x.dmft")))
    err = info.value
    assert type(err) is cls, err.render()
    assert (err.pos.line, err.pos.col) == _line_col(text, at, after), err.render()
    assert message in err.message, err.render()
    lines = err.render().splitlines()
    assert lines[0].startswith(f"specs/x.dmft:{err.pos.line}:{err.pos.col}: error: ") and "^" in lines[2]


def _module(tmp_path, text, name):
    path = tmp_path / f"{name}.dmft"
    path.write_text(text.replace("model two_layer_sgd", f"model {name}", 1).replace("model two_layer ",
                                                                                     f"model {name} ", 1))
    return dmftc.load(path)


# two_layer.dmft without its test point: the same sources as two_layer_sgd.dmft (u, then r), so the same draws
PLAIN_ONE = """\
model plain_one "two-layer net, one training point"
param gamma = 1.0
param y = 1.0
time t: T = 100 steps of eta = 0.02
activation phi(h) = tanh(h)
order Delta(t), K(t)
process:
  u ~ normal(0, 1);   r ~ normal(0, 1)
  h(t) = u + gamma * integral(Delta(s) * g(s), s < t)
  z(t) = r + gamma * integral(Delta(s) * phi(h(s)), s < t)
  g(t) = phi'(h(t)) * z(t)
action:
    integral(hat K(t) K(t) + hat Delta(t) (Delta(t) - y), t)
  + log E[exp(-integral(hat K(t) (phi(h(t))^2 + g(t)^2) + hat Delta(t) (r phi(u) - z(t) phi(h(t))) / gamma, t))]
"""


def _close(a, b, what):
    for q in ("Delta", "K"):
        scale = np.max(np.abs(b[q]))
        np.testing.assert_allclose(a[q], b[q], rtol=0, atol=1e-10 * scale, err_msg=f"{what}: {q}")


def _solve(m, correction=False, **kw):
    sol = m.solve(samples=2000, seed=4, groups=4, progress=False, backend="mc", correction=correction, **kw)
    out = ({q: sol.mean(q) for q in ("Delta", "K")}, {q: sol.var(q) for q in ("Delta", "K")})
    return out + (({q: sol.mean_correction(q) for q in ("Delta", "K")},) if correction else ())


def test_plain_gradient_descent_in_recurrence_form_is_two_layer(tmp_path):
    """With beta = lam = 0 and lr = 1, two_layer_sgd.dmft is two_layer.dmft without its test point: the same
    means and N Var to round-off on the same samples (Monte Carlo), and the same N Var on the same cubature rule."""
    kw = dict(gamma=1.5, y=-0.7, eta=0.1, T=10)
    sgd = dmftc.load(ROOT / "specs" / "two_layer_sgd.dmft")
    plain = _module(tmp_path, PLAIN_ONE, "plain_one")
    a = _solve(sgd, beta=0.0, lam=0.0, lr=1.0, **kw)
    b = _solve(plain, **kw)
    for x, y, what in zip(a, b, ("means", "N Var")):
        _close(x, y, what)
    cub = [m.solve(backend="cubature", samples=400, progress=False, **extra, **kw) for m, extra in
           ((sgd, dict(beta=0.0, lam=0.0)), (plain, {}))]
    _close(*({q: s.var(q) for q in ("Delta", "K")} for s in cub), "cubature N Var")
    c = _solve(sgd, beta=0.5, lam=0.0, lr=1.0, **kw)          # and the comparison can fail
    assert np.max(np.abs(c[0]["Delta"] - b[0]["Delta"])) > 1e-3


def test_plain_gradient_descent_mean_correction(tmp_path):
    """... and the same O(1/N) mean corrections (the Numba solves of the generated module)."""
    kw = dict(gamma=1.5, y=-0.7, eta=0.1, T=10)
    a = _solve(dmftc.load(ROOT / "specs" / "two_layer_sgd.dmft"), correction=True, beta=0.0, lam=0.0, **kw)
    b = _solve(_module(tmp_path, PLAIN_ONE, "plain_one"), correction=True, **kw)
    _close(a[2], b[2], "O(1/N) mean correction")


@pytest.mark.parametrize("lam, lr", [(0.4, 1.0), (0.0, np.linspace(0.3, 1.2, 10))], ids=["decay", "schedule"])
def test_per_step_parameter_and_time_values(tmp_path, lam, lr):
    """A schedule read in an integrand (lr[s]) and weight decay written with time as a value,
    h(t) = (1 - eta lam)^t (u + gamma integral((1 - eta lam)^(-s - 1) lr[s] Delta(s) g(s), s < t)), give the
    recurrence form's numbers (beta = 0; the decay is (1 - eta lam lr[t]) per step, so one of the two at a time)
    to round-off."""
    decay = "(1 - eta * lam)"
    text = (PLAIN_ONE.replace("param y = 1.0", "param y = 1.0\nparam lam = 0.0\nparam lr[T] = 1.0")
            .replace("h(t) = u + gamma * integral(Delta(s) * g(s), s < t)",
                     f"h(t) = {decay}^t * (u + gamma * integral({decay}^(-s - 1) * lr[s] * Delta(s) * g(s), s < t))")
            .replace("z(t) = r + gamma * integral(Delta(s) * phi(h(s)), s < t)",
                     f"z(t) = {decay}^t * (r + gamma * integral({decay}^(-s - 1) * lr[s] * Delta(s) * phi(h(s)), "
                     "s < t))"))
    kw = dict(gamma=1.5, y=-0.7, eta=0.1, T=10, lam=lam, lr=lr)
    a = _solve(_module(tmp_path, text, "closed_form"), **kw)
    b = _solve(dmftc.load(ROOT / "specs" / "two_layer_sgd.dmft"), beta=0.0, **kw)
    _close(a[0], b[0], "means")
    _close(a[1], b[1], "N Var")


def test_per_step_parameter_shape():
    m = dmftc.load(ROOT / "specs" / "two_layer_sgd.dmft")
    with pytest.raises(ParameterError, match="lr"):
        m.solve(T=10, lr=np.ones(7), samples=64, progress=False)
