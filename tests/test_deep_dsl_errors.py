"""Bad deep specs give located SpecErrors (file:line:col, caret line, hint), never a traceback.

Every case is a textual mutation of specs/deep_tanh.dmft run through parse -> check -> derive; the
expected location is computed from the mutated text (the offending token), not hard-coded.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from dmftc.frontend.check import check
from dmftc.derive import derive
from dmftc.errors import (CausalitySpecError, NameSpecError, ShapeSpecError, SpecError, StructureSpecError,
                          SyntaxSpecError)
from dmftc.frontend.parse import parse

SPECS = Path(__file__).resolve().parent.parent / "specs"
DEEP = ("deep_tanh", "deep_linear")


def spec_text(name):
    """A shipped deep spec (written as an action), or the direct form of deep_tanh (``deep_tanh_direct``: the
    order parameters given by their averages), kept in tests/specs/."""
    if name.endswith("_direct"):
        return (Path(__file__).resolve().parent / "specs" / f"{name}.dmft").read_text()
    return (SPECS / f"{name}.dmft").read_text()


def mutate(*edits, name="deep_tanh"):
    text = spec_text(name)
    for old, new in edits:
        assert old in text, f"mutation target {old!r} not in {name}.dmft"
        text = text.replace(old, new, 1)
    return text


def locate(text, needle, after=None):
    start = text.index(after) + len(after) if after else 0
    i = text.index(needle, start)
    return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


@dataclass
class Case:
    id: str
    edits: tuple
    exc: type
    at: str
    message: str
    hint: str | None = None
    after: str | None = None
    spec: str = "deep_tanh"


H_INT = "gamma * integral(Delta(s) Phi[l-1](t, s) g[l](s), s < t)"
H_SUM = "sum(s < t: A[l-1](t, s) g[l](s))"
Z_INT = "gamma * integral(Delta(s) G[l+1](t, s) phi(h[l](s)), s < t)"

CASES = [
    # ---------------------------------------------------------------- causality
    Case("integral-not-strict", ((H_INT, H_INT.replace("s < t", "s <= t")),), CausalitySpecError,
         at="integral(Delta(s) Phi", message="integral over s <= t is not strictly causal",
         hint="sum(s <= t: ...)"),
    Case("sum-into-future", ((H_SUM, H_SUM.replace("s < t", "s > t")),), CausalitySpecError,
         at="sum(s > t", message="sum over s > t uses the future"),
    Case("same-time-cycle", ((H_SUM, H_SUM.replace("s < t", "s <= t")),), CausalitySpecError,
         at="g[l](s))", after="h[l](t) = ", message="fields depend on each other at the same time: h -> g -> h"),
    Case("order-at-t-in-field", (("g[l](t) = phi'(h[l](t)) z[l](t)", "g[l](t) = phi'(h[l](t)) z[l](t) Delta(t)"),),
         CausalitySpecError, at="Delta(t)", after="g[l](t) = ",
         message="order parameter 'Delta' enters field equations only through causal sums"),
    # ---------------------------------------------------------------- the gradient field g = a(h) z + b(h)
    Case("gradient-nonlinear-in-z", (("phi'(h[l](t)) z[l](t)\n", "phi'(h[l](t)) z[l](t)^2\n"),), StructureSpecError,
         at="phi'(h[l](t)) z[l](t)^2", after="g[l](t) = ",
         message="the gradient field must be g[l](t) = a(h[l](t)) * z[l](t) + b(h[l](t))",
         hint="gradient descent is g[l](t) = phi'(h[l](t)) * z[l](t)"),
    Case("gradient-reads-the-source", (("phi'(h[l](t)) z[l](t)\n", "phi'(h[l](t)) z[l](t) + u[l](t)\n"),),
         StructureSpecError, at="phi'(h[l](t)) z[l](t) + u", after="g[l](t) = ", message="this one has u[l](t)"),
    Case("gradient-without-z", (("phi'(h[l](t)) z[l](t)\n", "phi'(h[l](t))\n"),), StructureSpecError,
         at="phi'(h[l](t))", after="g[l](t) = ", message="this one has no z[l](t)"),
    Case("gradient-with-a-sum", (("phi'(h[l](t)) z[l](t)\n", f"phi'(h[l](t)) z[l](t) + {H_SUM}\n"),),
         StructureSpecError, at="phi'(h[l](t)) z[l](t) + sum", after="g[l](t) = ", message="a sum over time"),
    Case("source-inside-sum", ((H_SUM, "sum(s < t: A[l-1](t, s) u[l](s))"),), CausalitySpecError,
         at="u[l](s)", message="the source 'u' enters at the current time only"),
    Case("kernel-at-wrong-times", ((H_INT, H_INT.replace("Phi[l-1](t, s)", "Phi[l-1](s, t)")),), CausalitySpecError,
         at="Phi[l-1](s, t)", message="a kernel in a field equation is taken at (t, s)"),
    # ---------------------------------------------------------------- layer ranges
    Case("two-layers-below", ((H_SUM, H_SUM.replace("A[l-1]", "A[l-2]")),), ShapeSpecError,
         at="l-2", message="A[l-2] needs A[-1] at l = 1, which is not defined", hint="boundaries A[0]"),
    Case("two-layers-above", ((Z_INT, Z_INT.replace("G[l+1]", "G[l+2]")),), ShapeSpecError,
         at="l+2", message="G[l+2] needs G[L+2]", hint="add a boundary value such as 'G[L+2](t, s) = ...'"),
    Case("missing-boundary", (("A[0](t, s) = 0;  ", ""),), ShapeSpecError,
         at="l-1", after="sum(s < t: A[", message="A[l-1] needs A[0] at l = 1, which is not defined",
         hint="has no boundary values"),
    Case("boundary-inside-range", (("Phi[0](t, s) = 1", "Phi[1](t, s) = 1"),), SpecError,
         at="1](t, s) = 1", message="'Phi[1]' is inside the layer range l = 1..L"),
    Case("field-of-other-layer", ((H_SUM, "sum(s < t: A[l-1](t, s) g[l-1](s))"),), StructureSpecError,
         at="g[l-1](s)", message="layers are coupled only through order parameters"),
    # ---------------------------------------------------------------- names
    Case("undefined-family", ((H_INT, H_INT.replace("Phi[l-1]", "Psi[l-1]")),), NameSpecError,
         at="Psi[l-1]", message="undefined name 'Psi'", hint="did you mean 'Phi'?"),
    Case("not-a-layer-index", ((H_SUM, H_SUM.replace("A[l-1]", "A[k-1]")),), NameSpecError,
         at="k-1", message="'k' is not a layer index"),
    Case("family-without-definition", (("  G[l](t, s) = E[g[l](t) g[l](s)]\n", ""),), StructureSpecError,
         at="G[l](t, s)", after="order ", message="order parameter 'G' has no definition at layer 'l'", spec="deep_tanh_direct"),
    # ---------------------------------------------------------------- sources
    Case("gp-cov-is-response", (("gp(0, Phi[l-1])", "gp(0, A[l-1])"),), StructureSpecError,
         at="A[l-1])", message="the covariance of 'u' is a response function 'A', not a two-time order parameter"),
    Case("gp-cov-not-adjacent", (("gp(0, Phi[l-1])", "gp(0, Phi[l])"),), StructureSpecError,
         at="Phi[l])", message="must be an order parameter of an adjacent layer (l-1 or l+1), got Phi[l]"),
    Case("gp-cov-two-below", (("gp(0, Phi[l-1])", "gp(0, Phi[l-2])"),), StructureSpecError,
         at="Phi[l-2])", message="adjacent layer"),
    Case("normal-source", (("u[l] ~ gp(0, Phi[l-1])", "u[l] ~ normal(0, 1)"),), StructureSpecError,
         at="normal", message="sources of a deep spec are Gaussian processes over time"),
    # ---------------------------------------------------------------- arity
    Case("kernel-one-time", ((H_INT, H_INT.replace("Phi[l-1](t, s)", "Phi[l-1](s)")),), ShapeSpecError,
         at="Phi[l-1](s)", message="order parameter 'Phi' takes 2 time arguments, got 1",
         hint="write Phi[l](t, s)"),
    Case("definition-one-time", (("Phi[l](t, s) = E[", "Phi[l](t) = E["),), ShapeSpecError,
         at="Phi[l](t) = E", message="'Phi' is a two-time layer family", spec="deep_tanh_direct"),
    Case("family-without-index", ((H_INT, H_INT.replace("Phi[l-1](t, s)", "Phi(t, s)")),), ShapeSpecError,
         at="Phi(t, s)", message="order parameter 'Phi' needs one layer index, got 0"),
    Case("order-decl-one-time", (("Phi[l](t, s), G[l](t, s)", "Phi[l](t), G[l](t, s)"),), ShapeSpecError,
         at="Phi[l](t)", message="layer family 'Phi' needs two time arguments"),
    # ---------------------------------------------------------------- depth parameter
    Case("depth-not-integer", (('param L = 2 "hidden layers"', 'param L = 2.5 "hidden layers"'),), ShapeSpecError,
         at="2.5", message="the depth parameter 'L' must be an integer >= 1"),
    Case("depth-zero", (('param L = 2 "hidden layers"', 'param L = 0 "hidden layers"'),), ShapeSpecError,
         at="0 \"hidden", message="the depth parameter 'L' must be an integer >= 1"),
    Case("depth-undeclared", (("layers l = 1..L", "layers l = 1..Depth"),), NameSpecError,
         at="Depth", message="the depth 'Depth' is not a parameter"),
    # ---------------------------------------------------------------- responses and structure
    Case("response-wrt-field", (("/ d r[l](s)]", "/ d z[l](s)]"),), StructureSpecError,
         at="z[l](s)]", message="responses are derivatives with respect to a source", spec="deep_tanh_direct"),
    Case("response-not-derivative", (("A[l](t, s) = E[d phi(h[l](t)) / d r[l](s)]", "A[l](t, s) = 0"),),
         StructureSpecError, at="0\n", after="A[l](t, s) = ",
         message="response function 'A' must be defined as an average derivative", spec="deep_tanh_direct"),
    Case("kernel-not-its-average", (("E[g[l](t) g[l](s)]", "E[g[l](t) z[l](s)]"),), StructureSpecError,
         at="E[g[l](t) z", message="'G[l]' must be the average", spec="deep_tanh_direct"),
    Case("action-and-direct-definition", (), NameSpecError, at="K(t) (K(t) - 1)",
         message="'K' is defined twice", spec="deep_tanh_direct_action"),
    # ---------------------------------------------------------------- actions
    Case("pair-missing", ((" + hat G[l](t, s) G[l](t, s), s <= t), t))", ", s <= t), t))"),), StructureSpecError,
         at="hat G[l](t, s) g[l](t)", message="'hat G' enters the log-partition function but has no kernel pair"),
    Case("pair-wrong-kernel", (("hat G[l](t, s) G[l](t, s), s", "hat G[l](t, s) Phi[l](t, s), s"),),
         StructureSpecError, at="hat G[l](t, s) Phi", message="the kernel pair of 'hat G' must be"),
    Case("pair-one-time", (("integral(integral(hat Phi[l](t, s) Phi[l](t, s) + hat G[l](t, s) G[l](t, s), s <= t), t)",
                            "integral(hat Phi[l](t, t) Phi[l](t, t), t)"),), StructureSpecError,
         at="integral(hat Phi[l](t, t)", message="two-time terms of a deep action are double integrals over s <= t"),
    Case("trace-offset", (("trace(A[l], B[l+1])", "trace(A[l], B[l])"),), StructureSpecError,
         at="trace(A[l], B[l])", message="trace pairs a kernel with the next layer's"),
    Case("trace-sign", (("  - sum(l = 0..L: trace", "  + sum(l = 0..L: trace"),), StructureSpecError,
         at="trace(A", message="the response pairing enters the action as"),
    Case("constraint-form", (("hat K(t) (K(t) - sum(", "hat K(t) (2 K(t) - sum("),), StructureSpecError,
         at="2 K(t) - sum", message="a constraint is integral(hat K(t) (K(t) - ...), t)"),
    Case("log-z-layers", (("+ sum(l = 1..L: log E", "+ sum(l = 0..L: log E"),), StructureSpecError,
         at="sum(l = 0..L: log", message="this layer sum must run over the hidden layers"),
    Case("hat-of-kernel-one-time", (("hat Phi[l](t, s) phi(h[l](t))", "hat Phi[l](t) phi(h[l](t))"),),
         StructureSpecError, at="hat Phi[l](t) phi", message="'hat Phi' here is the dual of a two-time kernel"),
    # ---------------------------------------------------------------- syntax
    Case("shift-without-number", ((H_SUM, H_SUM.replace("A[l-1]", "A[l-]")),), SyntaxSpecError,
         at="](t, s) g[l](s))", after="A[l-", message="unexpected ']'; expected a number"),
]


def _text(case):
    if case.spec == "deep_tanh_direct_action":
        return spec_text("deep_tanh_direct") + "action:\n  integral(hat K(t) (K(t) - 1), t)\n"
    return mutate(*case.edits, name=case.spec)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_deep_spec_is_located(case):
    text = _text(case)
    with pytest.raises(SpecError) as info:
        derive(check(parse(text, "specs/deep_tanh.dmft")))
    err = info.value
    assert type(err) is case.exc, err.render()
    assert case.message in err.message, err.render()
    if case.hint is not None:
        assert err.hint and case.hint in err.hint, err.render()
    line, col = locate(text, case.at, case.after)
    assert (err.pos.line, err.pos.col) == (line, col), err.render()
    rendered = err.render().splitlines()
    assert re.fullmatch(rf"specs/deep_tanh\.dmft:{line}:{col}: error: .+", rendered[0])
    assert rendered[1].partition(" | ")[2] == text.splitlines()[line - 1]
    assert "^" in rendered[2]


def test_deep_constructs_in_a_two_layer_spec_are_explained():
    text = (SPECS / "eos.dmft").read_text().replace("u ~ normal(0, 1)", "u ~ gp(0, 1)")
    with pytest.raises(StructureSpecError) as info:
        check(parse(text, "specs/eos.dmft"))
    assert "need a layered spec" in info.value.message and "layers l = 1..L" in info.value.hint
    text = (SPECS / "eos.dmft").read_text().replace("integral(Delta(s) * z(s), s < t)",
                                                                  "sum(s < t: Delta(s) * z(s))")
    with pytest.raises(StructureSpecError, match="sum over earlier times is only available in deep specs"):
        check(parse(text, "specs/eos.dmft"))
    text = (SPECS / "eos.dmft").read_text().replace("+ hat K(t) K(t), t)", "+ hat K(t, s) K(t), t)")
    with pytest.raises(ShapeSpecError, match="two-time kernels and their duals belong to deep specs") as info:
        check(parse(text, "specs/eos.dmft"))
    assert (info.value.pos.line, info.value.pos.col) == locate(text, "hat K(t, s)")


@pytest.mark.parametrize("name", DEEP + ("deep_tanh_direct",))
def test_shipped_deep_specs_check(name):
    model = check(parse(spec_text(name), f"specs/{name}.dmft"))
    assert model.layer_var == "l" and model.depth == "L"
    assert model.families == ("Phi", "G") and model.responses == ("A", "B")
    assert [f.name for f in model.fields] == ["h", "z", "g"]
    assert {k: [r.text() for r, _ in v] for k, v in model.boundaries.items()} == {
        "Phi": ["0"], "G": ["L+1"], "A": ["0"], "B": ["L+1"]}
    assert [(g.name, g.cov_family, g.offset) for g in model.sources] == [("u", "Phi", -1), ("r", "G", 1)]


def test_d_stays_a_name_outside_response_averages():
    text = spec_text("deep_tanh").replace('param y = 1.0 "training target"',
                                          'param y = 1.0 "training target"\nparam d = 2.0')
    text = text.replace("gamma * integral(Delta(s) Phi", "d / d * gamma * integral(Delta(s) Phi")
    d = derive(check(parse(text, "x.dmft")))
    assert d.couplings.h_past.has(d.t)   # parsed, and d / d cancelled


@pytest.mark.parametrize("name, every", [("deep_tanh", 24),
                                         pytest.param("deep_tanh", 1, marks=pytest.mark.slow),
                                         pytest.param("deep_linear", 1, marks=pytest.mark.slow)])
def test_token_edits_never_escape(name, every):
    """Deleting or replacing one token gives a valid spec or a located SpecError, never a traceback
    (every ``every``-th token; all of them in the slow suite)."""
    from dmftc.codegen.deep import emit_deep

    text = spec_text(name)
    body = text.index("\nmodel ")
    toks = list(re.finditer(r"[A-Za-z_][A-Za-z_0-9]*|[0-9.]+|<=|>=|\S", text[body:]))
    located = 0
    for k in range(0, len(toks), every):
        m = toks[k]
        for new in ("", "l+1", "s", ")"):
            mutant = text[:body + m.start()] + new + text[body + m.end():]
            try:
                emit_deep(derive(check(parse(mutant, "x.dmft"))), spec_path="x.dmft", spec_sha256="0")
            except SpecError as err:
                assert err.pos is not None, err.render()
                err.render()
                located += 1
    assert located > 50 * 12 // every


def test_activation_cannot_use_the_layer_index():
    text = spec_text("deep_tanh").replace("activation phi(h) = tanh(h)", "activation phi(h) = tanh(l * h)")
    with pytest.raises(StructureSpecError, match="an activation cannot depend on the layer index 'l'") as info:
        check(parse(text, "x.dmft"))
    assert (info.value.pos.line, info.value.pos.col) == locate(text, "l * h")


@pytest.mark.parametrize("edit,needle,what", [
    (("A[0](t, s) = 0", "A[0](t, s) = 0.5"), "A[0](t, s) = 0.5", "boundary response A must be 0"),
    (("B[L+1](t, s) = 0", "B[L+1](t, s) = -0.25"), "B[L+1](t, s) = -0.25", "boundary response B must be 0"),
])
def test_spec_the_propagator_cannot_read_is_located(tmp_path, edit, needle, what):
    """A spec that passes the checker but not the propagator's structure checks (dmftc.runtime.problem.deep_model.from_spec):
    the means are solved, and asking for a variance raises a StructureSpecError at the offending spec text
    (file:line:col, the line, a caret, a hint), located through the generated module's SOURCE_POS."""
    import dmftc

    text = mutate(edit)
    spec = tmp_path / "bad_boundary.dmft"
    spec.write_text(text)
    sol = dmftc.load(spec, tmp_path / "gen").solve(T=3, samples=200, propagator_samples=40, propagator_groups=2)
    assert sol.mean("Delta").shape == (3,)
    with pytest.raises(StructureSpecError, match=what) as info:
        sol.var("Delta")
    line, col = locate(text, needle)
    shown = info.value.render()
    assert shown.startswith(f"bad_boundary.dmft:{line}:{col}: error:"), shown
    assert f"{line:>5} | " + text.splitlines()[line - 1] in shown and "\n" + " " * (col + 7) + "^~" in shown
    assert "hint:" in shown
