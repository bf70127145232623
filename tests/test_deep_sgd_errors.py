"""Bad time coefficients in a deep spec (specs/deep_sgd.dmft mutated) give located SpecErrors (file:line:col, caret
line, hint), never a traceback."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dmftc.codegen.deep import emit_deep
from dmftc.derive import derive
from dmftc.errors import CausalitySpecError, NameSpecError, ShapeSpecError, SpecError, StructureSpecError
from dmftc.frontend.check import check
from dmftc.frontend.parse import parse

TEXT = (Path(__file__).resolve().parent.parent / "specs" / "deep_sgd.dmft").read_text()
Q = "q(t, s) = beta * q(t - 1, s) - eta * lam * c(t, s)"
C = "c(t, s) = c(t - 1, s) + lr[t - 1] * q(t - 1, s)"
H = "integral(c(t, s) / a(t) Delta(s) Phi[l-1](t, s) g[l](s), s < t)"
A = "a(t) = a(t - 1) - eta * lr[t - 1] * v(t - 1)"

CASES = [
    ("no-initial-value", ((";  q(s, s) = 1", ""),), StructureSpecError, "q(t, s)",
     "the coefficient 'q' has no initial value", "q(s, s) = ..."),
    ("initial-without-recurrence", ((Q, "q2(t, s) = beta * q2(t - 1, s)"),), StructureSpecError, "q(s, s)",
     "'q(s, s)' is the initial value of a coefficient", None),
    ("reads-an-order-parameter", ((Q, "q(t, s) = beta * q(t - 1, s) * Delta(t)"),), StructureSpecError, "Delta(t)",
     "the recurrence of 'q' cannot read 'Delta'", "depends on the parameters only"),
    ("reads-itself-now", ((Q, "q(t, s) = beta * q(t, s)"),), CausalitySpecError, "q(t, s);",
     "'q(t, s)' is defined in terms of itself", "q(t - 1, s)"),
    ("reads-another-time", ((C, "c(t, s) = c(t - 1, s) + lr[t - 1] * q(t - 2, s)"),), CausalitySpecError,
     "q(t - 2, s)", "at other times than", None),
    ("per-step-now", ((C, "c(t, s) = c(t - 1, s) + lr[t] * q(t - 1, s)"),), CausalitySpecError, "lr[t]",
     "reads 'lr[t]'", "lr[t - 1]"),
    ("same-time-cycle", ((C, "c(t, s) = c(t - 1, s) + lr[t - 1] * q(t, s)"),),
     CausalitySpecError, "c(t - 1, s) + lr[t - 1] * q(t, s)",
     "coefficients depend on each other at the same time", "(t - 1, s)"),
    ("initial-reads-a-time", (("c(s, s) = 0\n", "c(s, s) = s\n"),), StructureSpecError, "s\n  q(t, s)",
     "the initial value c(s, s) cannot read 's'", "numbers and parameters"),
    ("outside-a-sum", (("h[l](t) = u[l](t) +", "h[l](t) = u[l](t) + c(t, t) +"),), CausalitySpecError, "c(t, t)",
     "enters field equations only through causal sums", None),
    ("wrong-times-in-a-sum", ((H, H.replace("c(t, s)", "c(s, t)")),), CausalitySpecError, "c(s, t)",
     "is taken at (t, s)", None),
    ("in-a-scalar", (("K(t) - sum(l = 0..L:", "K(t) - c(t, t) * sum(l = 0..L:"),), StructureSpecError, "c(t, t)",
     "is read in field equations only", None),
    ("with-a-layer-index", ((H, H.replace("c(t, s)", "c[l](t, s)")),), ShapeSpecError, "c[l](t, s)",
     "has no layer index", None),
    ("second-time-is-t", (("c(s, s) = 0\n", "c(t, t) = 0\n"),), NameSpecError, "t, t) = 0",
     "is written at its second time", None),
    # one-time coefficients (the weight decay's a(t), v(t))
    ("one-time-no-initial-value", ((";       a(0) = 1", ""),), StructureSpecError, A,
     "the one-time coefficient 'a' has no initial value", "a(0) = ..."),
    ("one-time-initial-not-at-0", (("a(0) = 1", "a(1) = 1"),), StructureSpecError, "a(1) = 1",
     "the initial value of the one-time coefficient 'a' is given at 0", "a(0) = ..."),
    ("one-time-reads-itself-now", ((A, "a(t) = a(t) - eta * lr[t - 1] * v(t - 1)"),), CausalitySpecError,
     "a(t) - eta", "'a(t)' is defined in terms of itself", "a(t - 1)"),
    ("one-time-cycle", ((A, "a(t) = a(t - 1) - eta * lr[t - 1] * v(t)"),), CausalitySpecError,
     "a(t - 1) - eta", "coefficients depend on each other at the same time: a -> v -> a", "(t - 1)"),
    ("one-time-reads-two-time", (("v(t) = beta * v(t - 1)", "v(t) = beta * c(t - 1, s)"),), StructureSpecError,
     "c(t - 1, s) + lam", "the recurrence of 'v' cannot read 'c'", None),
    ("one-time-two-times", ((H, H.replace("a(t)", "a(t, s)")),), ShapeSpecError, "a(t, s)",
     "a one-time coefficient 'a' takes 1 time argument, got 2", "write a(t)"),
    ("one-time-with-a-layer-index", ((H, H.replace("a(t)", "a[l](t)")),), ShapeSpecError, "a[l](t)",
     "has no layer index", "write a(t)"),
    ("one-time-in-a-scalar", (("K(t) - sum(l = 0..L:", "K(t) - a(t) * sum(l = 0..L:"),), StructureSpecError,
     "a(t) * sum", "the one-time coefficient 'a' is read in field equations and averages only", None),
    ("decay-per-step", (("param lam = 0.0", "param lam[T] = 0.0"),), StructureSpecError, "lam * a(t)",
     "the recurrence of 'v' cannot read 'lam'", None),
    ("activation-argument-differs", (("B[l+1](t, s) phi(a(s) h[l](s))", "B[l+1](t, s) phi(a(t) h[l](s))"),),
     StructureSpecError, "r[l](t) + sum(s <= t", "the activation's argument differs between the sums", None),
    ("gradient-field-unscaled", (("g[l](t) = a(t) phi'", "g[l](t) = phi'"),), StructureSpecError,
     "phi'(a(t) h[l](t)) z", "the gradient field must be g[l](t) = a(t) * phi'(a(t)*h[l](t)) * z[l](t)", None),
    ("readout-unscaled", (("E[a(t) z[L](t)", "E[z[L](t)"),), StructureSpecError, "E[z[L](t)",
     "reads the output from E[a(t) z[L](t) phi(a(t) h[L](t))]", None),
]


def _locate(text, needle):
    i = text.index(needle, text.index("\nprocess:"))
    return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


@pytest.mark.parametrize("edits, exc, at, message, hint", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_coefficient_is_located(edits, exc, at, message, hint):
    text = TEXT
    for old, new in edits:
        i0 = 0 if old.startswith("param") else text.index("\nprocess:")      # (not the header's equations)
        assert old in text[i0:], old
        text = text[:i0] + text[i0:].replace(old, new, 1)
    with pytest.raises(SpecError) as info:
        derive(check(parse(text, "specs/deep_sgd.dmft")))
    err = info.value
    assert type(err) is exc, err.render()
    assert message in err.message, err.render()
    if hint is not None:
        assert err.hint and hint in err.hint, err.render()
    line, col = _locate(text, at)
    assert (err.pos.line, err.pos.col) == (line, col), err.render()
    rendered = err.render().splitlines()
    assert re.fullmatch(rf"specs/deep_sgd\.dmft:{line}:{col}: error: .+", rendered[0])
    assert "^" in rendered[2]


@pytest.mark.slow
def test_token_edits_never_escape():
    """Deleting or replacing one token of the coefficient lines gives a valid spec or a located SpecError."""
    start, end = TEXT.index("  a(t) =", TEXT.index("\nprocess:")), TEXT.index("  u[l] ~")
    located = 0
    toks = list(re.finditer(r"[A-Za-z_][A-Za-z_0-9]*|[0-9.]+|<=|>=|\S", TEXT[start:end]))
    for m in toks[::5]:
        for new in ("", ")"):
            mutant = TEXT[:start + m.start()] + new + TEXT[start + m.end():]
            try:
                emit_deep(derive(check(parse(mutant, "x.dmft"))), spec_path="x.dmft", spec_sha256="0")
            except SpecError as err:
                assert err.pos is not None, err.render()
                err.render()
                located += 1
    assert located > 8
