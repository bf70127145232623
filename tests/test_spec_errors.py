"""Bad specs give located, readable SpecErrors (never a traceback).

Every case is a small textual mutation of a shipped spec, compiled through
parse -> check -> derive.  The expected location is computed from the mutated
text (by finding the offending token), not hard-coded.
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
SHIPPED = ("two_layer", "two_layer_multi", "linear_whitened", "eos")


def spec_text(name: str) -> str:
    return (SPECS / f"{name}.dmft").read_text()


def mutate(name: str, *edits: tuple[str, str]) -> str:
    """A shipped spec with each ``old`` replaced (first occurrence) by ``new``."""
    text = spec_text(name)
    for old, new in edits:
        assert old in text, f"mutation target {old!r} not in {name}.dmft"
        text = text.replace(old, new, 1)
    return text


def compile_text(text: str, name: str):
    return derive(check(parse(text, f"specs/{name}.dmft")))


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset."""
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, col


def locate(text: str, needle: str, *, after: str | None = None, shift: int = 0) -> tuple[int, int]:
    """Line/column of ``needle`` (first occurrence, past ``after`` if given), moved ``shift`` characters."""
    start = 0
    if after is not None:
        start = text.index(after) + len(after)
    i = text.index(needle, start)
    return line_col(text, i + shift)


@dataclass
class Case:
    id: str
    spec: str
    edits: tuple[tuple[str, str], ...]
    exc: type
    at: str                      # the offending text in the mutated spec
    message: str                 # substring of the message
    hint: str | None = None      # substring of the hint
    after: str | None = None     # find ``at`` after this text
    shift: int = 0               # column offset within ``at``


EOS_H = "h(t) = u + gamma * integral(Delta(s) * z(s), s < t)"
EOS_Z = "z(t) = r + gamma * integral(Delta(s) * h(s), s < t)"
EOS_OBS = "hat K(t) (h(t)^2 + z(t)^2)"

CASES = [
    # ------------------------------------------------------------------ syntax
    Case("missing-paren", "eos", ((EOS_H, EOS_H[:-1]),), SyntaxSpecError,
         at=EOS_H[:-1] + "\n", shift=len(EOS_H) - 1,
         message="expected ')' before the end of the line; the '(' at line 12, column 30 is not closed",
         hint="next line was read as part of this one"),
    Case("stray-brace", "two_layer", (("gamma * kx * integral", "gamma { kx * integral"),), SyntaxSpecError,
         at="{", message="unexpected character '{'", hint="use '(' and ')' to group expressions"),
    Case("stray-at", "eos", (("param y = 1.0", "param y = 1.0 @"),), SyntaxSpecError,
         at="@", message="unexpected character '@'"),
    Case("truncated-action", "eos", (("(h(t)^2 + z(t)^2), t))]", "(h(t)^2"),), SyntaxSpecError,
         at="(h(t)^2\n", shift=len("(h(t)^2"), message="unexpected end of file; expected ')'",
         hint="is not closed"),
    Case("missing-separator", "eos", (("u ~ normal(0, 1);  r ~", "u ~ normal(0, 1)  r ~"),), SyntaxSpecError,
         at="r ~", message="unexpected 'r'", hint="separate statements with a newline or ';'"),
    Case("missing-separator-equations", "two_layer", (("z(t);   g_star(t)", "z(t)   g_star(t)"),), SyntaxSpecError,
         at="g_star(t) =", message="expected a newline or ';' before 'g_star'",
         hint="separate statements with a newline or ';'"),
    Case("dangling-operator", "eos", ((EOS_H, "h(t) = u + gamma *"),), SyntaxSpecError,
         at="*\n", message="'*' at the end of the line has no right operand", hint="continues on the next line"),
    Case("non-integer-steps", "eos", (("T = 60 steps", "T = 1.5 steps"),), SyntaxSpecError,
         at="1.5", message="expected an integer, found '1.5'", hint="must be integers"),
    Case("continuation-without-operator", "eos", (("\n  + log E", "\n  log E"),), SyntaxSpecError,
         at="log E", message="unexpected 'log'", hint="start this line with an operator such as '+'"),
    Case("keyword-as-name", "eos", (("order Delta(t), K(t)", "order Delta(t), E(t)"),), SyntaxSpecError,
         at="E(t)", message="unexpected 'E'; expected a name", hint="'E' is a keyword"),
    Case("misspelled-model", "eos", (("model eos", "modle eos"),), SyntaxSpecError,
         at="modle", message="unexpected 'modle'; expected 'model'", hint="a spec starts with a line 'model <name>'"),
    # ------------------------------------------------------------------ names
    Case("misspelled-order-parameter", "eos", (("integral(Delta(s) * z(s)", "integral(Delt(s) * z(s)"),),
         NameSpecError, at="Delt(s)", message="undefined name 'Delt'", hint="did you mean 'Delta'?"),
    Case("misspelled-field", "two_layer", (("phi'(h_star(t))", "phi'(h_str(t))"),), NameSpecError,
         at="h_str", message="undefined name 'h_str'", hint="did you mean 'h_star'?"),
    Case("misspelled-param", "eos", (("u + gamma *", "u + gama *"),), NameSpecError,
         at="gama", message="undefined name 'gama'", hint="did you mean 'gamma'?"),
    Case("misspelled-activation", "two_layer_multi", (("phi(h[nu](s))", "ph(h[nu](s))"),), NameSpecError,
         at="ph(h[nu](s))", message="undefined name 'ph'", hint="did you mean 'phi'?"),
    Case("misspelled-activation-prime", "two_layer", (("g(t) = phi'(h(t))", "g(t) = phy'(h(t))"),), NameSpecError,
         at="phy'", message="undefined name 'phy'", hint="did you mean 'phi'?"),
    Case("misspelled-sum-index", "linear_whitened", (("sum(nu: Delta[nu](s)", "sum(nux: Delta[nu](s)"),),
         NameSpecError, at="nux", message="'nux' is not a declared index", hint="did you mean 'nu'?"),
    Case("equation-only-function", "two_layer", (("phi(h(s))", "eye(h(s))"),), NameSpecError,
         at="eye(h(s))", message="'eye' can only be used in parameter values", hint="tanh"),
    Case("param-used-before-declared", "eos", (("param gamma = 6.0", "param gamma = 6.0 * y"),), NameSpecError,
         at="y \"feature", message="parameter 'y' is used before it has a value", hint="declaration order"),
    # ------------------------------------------------------------------ duplicates
    Case("param-twice", "eos", (("param y = 1.0", "param gamma = 2.0\nparam y = 1.0"),), NameSpecError,
         at="gamma", after="param gamma = 6.0", message="'gamma' is already defined as a parameter at line 6",
         hint="must be unique"),
    Case("field-twice", "eos", ((EOS_Z, EOS_Z.replace("z(t)", "h(t)")),), NameSpecError,
         at="h(t) = r", message="'h' is already defined as a field at line 12"),
    Case("field-named-like-param", "two_layer", (("g_star(t) =", "kx(t) ="),), NameSpecError,
         at="kx(t) =", message="'kx' is already defined as a parameter at line 11"),
    Case("field-named-like-order", "eos", (("order Delta(t), K(t)", "order Delta(t), K(t), h(t)"),), NameSpecError,
         at="h(t) = u", message="'h' is already defined as an order parameter at line 9"),
    # ------------------------------------------------------------------ causality
    Case("integral-s-le-t", "eos", ((EOS_H, EOS_H.replace("s < t", "s <= t")),), CausalitySpecError,
         at="integral(Delta(s) * z(s), s <= t)", message="integral over s <= t is not strictly causal",
         hint="use s < t"),
    Case("integral-s-gt-t", "eos", ((EOS_H, EOS_H.replace("s < t", "s > t")),), CausalitySpecError,
         at="integral(Delta(s) * z(s), s > t)", message="integral over s > t is not strictly causal",
         hint="use s < t"),
    Case("integral-s-ge-t", "two_layer", (("phi(h(s)), s < t)", "phi(h(s)), s >= t)"),), CausalitySpecError,
         at="integral(Delta(s) * phi(h(s)), s >= t)", message="integral over s >= t is not strictly causal",
         hint="use s < t"),
    Case("integral-wrong-upper-limit", "eos", ((EOS_H, EOS_H.replace("s < t", "s < q")),), CausalitySpecError,
         at="integral(Delta(s) * z(s), s < q)", message="upper limit 'q' is not the time 't'"),
    Case("order-parameter-at-t-in-field", "eos", (("h(t) = u + gamma", "h(t) = u + Delta(t) * gamma"),),
         CausalitySpecError, at="Delta(t) * gamma", message="order parameter 'Delta' enters field equations only "
         "through causal integrals", hint="integral(Delta(s)"),
    # ------------------------------------------------------------------ indices and arity
    Case("too-few-indices", "two_layer_multi", (("hat K[mu, nu](t) K[mu, nu](t)", "hat K[mu, nu](t) K[mu](t)"),),
         ShapeSpecError, at="K[mu](t)", message="'K' has 2 index(es), got 1", hint="write K[mu, nu]"),
    Case("missing-indices", "linear_whitened", (("(Delta[mu](t) - y[mu])", "(Delta(t) - y[mu])"),), ShapeSpecError,
         at="Delta(t) - y", message="'Delta' has 1 index(es), got 0", hint="write Delta[mu]"),
    Case("param-missing-indices", "linear_whitened", (("- y[mu])", "- y)"),), ShapeSpecError,
         at="y)", message="'y' has 1 index(es) but none were given", hint="write y[mu]"),
    Case("undeclared-index", "linear_whitened", (("integral(Delta[mu](s)", "integral(Delta[rho](s)"),),
         NameSpecError, at="rho", message="'rho' is not a declared index", hint="index rho in 1..P"),
    Case("unbound-index", "linear_whitened", (("integral(Delta[mu](s)", "integral(Delta[nu](s)"),), SpecError,
         at="nu](s) * z(s)", message="index 'nu' is not bound here", hint="sum(nu: ...)"),
    Case("function-too-few-args", "two_layer_multi", (("max(0, h)", "max(0)"),), ShapeSpecError,
         at="max(0)", message="'max' takes 2 argument(s), got 1"),
    Case("activation-too-many-args", "two_layer", (("phi(h(s))", "phi(h(s), s)"),), ShapeSpecError,
         at="phi(h(s), s)", message="'phi' takes 1 argument(s), got 2"),
    Case("field-two-time-args", "eos", ((EOS_H, EOS_H.replace("z(s)", "z(s, s)")),), ShapeSpecError,
         at="z(s, s)", message="field 'z' takes one time argument"),
    # ------------------------------------------------------------------ hats and the action
    Case("hat-on-param", "two_layer", (("hat K(t) K(t) +", "hat kx(t) K(t) +"),), NameSpecError,
         at="hat kx(t)", message="'kx' is not an order parameter", hint="order parameters: Delta, f_star, K, K_star"),
    Case("hat-misspelled", "two_layer", (("hat K_star(t) K_star(t)", "hat K_stat(t) K_star(t)"),), NameSpecError,
         at="hat K_stat(t)", message="undefined name 'K_stat'", hint="did you mean 'K_star'?"),
    Case("hat-outside-integral", "eos",
         (("integral(hat Delta(t) (Delta(t) - y) + hat K(t) K(t), t)",
           "hat K(t) K(t) + integral(hat Delta(t) (Delta(t) - y), t)"),), StructureSpecError,
         at="hat K(t) K(t)", message="'hat K' outside an integral over time", hint="integral(hat K(t)"),
    Case("order-without-constraint", "eos", (("+ hat K(t) K(t), t)", ", t)"),), StructureSpecError,
         at="K(t)", after="order Delta(t), ", message="order parameter 'K' has no constraint in the action",
         hint="add integral(hat K(t)"),
    Case("observable-hat-squared", "eos", ((EOS_OBS, "hat K(t)^2 (h(t)^2 + z(t)^2)"),), StructureSpecError,
         at="hat K(t)^2", message="not linear in the dual variable 'hat K'", hint="multiplies"),
    Case("observable-two-hats", "eos", ((EOS_OBS, "hat K(t) hat Delta(t) (h(t)^2 + z(t)^2)"),),
         StructureSpecError, at="hat Delta(t) (h", message="not linear in the dual variable 'hat Delta': "
         "it appears multiplied by another dual variable"),
    Case("log-E-without-exp", "eos", (("log E[exp(", "log E[("),), StructureSpecError,
         at="log E[(", shift=len("log E["), message="expected exp(...) inside log E[...]",
         hint="log E[exp(-integral("),
    Case("two-log-E-terms", "eos", (("/ gamma + hat K(t)", "/ gamma, t))] + log E[exp(-integral(hat K(t)"),),
         StructureSpecError, at="log E", after="/ gamma, t))] + ", message="only one log E[...] term"),
    Case("field-without-time-argument", "eos", (("(u r - z(t) h(t))", "(u r - z h(t))"),), ShapeSpecError,
         at="z h(t)", message="field 'z' needs a time argument", hint="write z(t)"),
    Case("field-in-deterministic-action", "eos", (("(Delta(t) - y)", "(Delta(t) - y + z(t))"),),
         StructureSpecError, at="z(t))", message="field 'z' used outside the single-site average"),
    Case("source-in-deterministic-action", "eos", (("(Delta(t) - y)", "(Delta(t) - y + u)"),),
         StructureSpecError, at="u)", after="Delta(t) - y + ", message="source 'u' used outside the single-site"),
    Case("same-time-cycle", "eos", ((EOS_H, "h(t) = u + z(t)"), (EOS_Z, "z(t) = r + h(t)")), StructureSpecError,
         at="z(t)", after="h(t) = u + ", message="fields depend on each other at the same time: h -> z -> h",
         hint="causal integral"),
    Case("constraint-reads-later-order-parameter", "eos", (("(Delta(t) - y)", "(Delta(t) - y + K(t))"),),
         StructureSpecError, at="Delta(t), K(t)", message="the constraint of 'Delta' couples it to K at the same time",
         hint="declared BEFORE it"),
    Case("indexed-constraint-reads-later-order-parameter", "linear_whitened",
         (("order Delta[mu](t)", "order c[mu](t), Delta[mu](t)"),
          ("(Delta[mu](t) - y[mu])), t)", "(Delta[mu](t) - y[mu]) + hat c[mu](t) (c[mu](t) - Delta[mu](t))), t)")),
         StructureSpecError, at="c[mu](t)", after="order ",
         message="the constraint of 'c' couples it to Delta at the same time", hint="declared BEFORE it"),
    Case("indexed-constraint-reads-its-own-components", "linear_whitened",
         (("(Delta[mu](t) - y[mu])), t)", "(Delta[mu](t) - y[mu] + sum(nu: Delta[nu](t)))), t)"),),
         StructureSpecError, at="Delta[mu](t)", after="order ",
         message="the constraint of 'Delta' couples it to Delta at the same time", hint="declared BEFORE it"),
    Case("nested-causal-integral", "eos", ((EOS_H, EOS_H.replace("Delta(s) * z(s)", "integral(z(r), r < t)")),),
         StructureSpecError, at="integral(z(r)", message="nested causal integrals are not supported",
         hint="intermediate field"),
    Case("hat-in-field-equation", "eos", ((EOS_H, "h(t) = u + gamma * hat Delta(t)"),), StructureSpecError,
         at="hat Delta(t)", after="h(t) = ", message="dual variables (hat ...) appear only in the action"),
    Case("activation-uses-order-parameter", "two_layer", (("tanh(h)", "tanh(h) * Delta(t)"),), StructureSpecError,
         at="Delta(t)", after="tanh(h) * ", message="an activation cannot depend on the order parameter 'Delta'"),
    Case("activation-recursion", "two_layer", (("tanh(h)", "phi(h)"),), StructureSpecError,
         at="phi(h) =", message="activation 'phi' is defined in terms of itself"),
    Case("nonzero-source-mean", "eos", (("u ~ normal(0, 1)", "u ~ normal(1, 1)"),), StructureSpecError,
         at="1, 1)", message="Gaussian sources must have mean 0"),
    # ------------------------------------------------------------------ the time variable
    Case("time-as-value", "eos", ((EOS_H, EOS_H.replace("z(s), s", "z(s) * t, s")),), SpecError,
         at="t, s < t", message="the time variable 't' cannot be used as a value"),
    Case("outer-time-inside-integral", "eos", ((EOS_H, EOS_H.replace("z(s)", "z(t)")),), SpecError,
         at="t), s < t", message="'t' is not a time variable in scope here", hint="time variables in scope: s"),
    Case("order-declared-at-other-time", "eos", (("order Delta(t)", "order Delta(s)"),), NameSpecError,
         at="Delta(s), K", message="order parameter 'Delta' must depend on the time variable 't'",
         hint="write Delta(t)"),
    Case("field-defined-at-other-time", "eos", ((EOS_H, EOS_H.replace("h(t) =", "h(s) =")),), NameSpecError,
         at="h(s) =", message="field 'h' must be defined at the time variable 't'"),
    Case("zero-steps", "eos", (("T = 60 steps", "T = 0 steps"),), SpecError,
         at="0 steps", message="the number of time steps must be positive"),
    Case("index-range-from-zero", "two_layer_multi", (("in 1..P", "in 0..P"),), SpecError,
         at="0..P", message="index ranges start at 1", hint="write 'in 1..P'"),
    Case("undeclared-dimension", "two_layer_multi", (("param Kx[P, P]", "param Kx[P, Q]"),), NameSpecError,
         at="Q]", message="dimension 'Q' of parameter 'Kx' is not a parameter", hint="param Q = 4"),
    Case("no-time-grid", "eos", (("time t: T = 60 steps of eta = 0.2\n", ""),), StructureSpecError,
         at="model eos", message="the spec declares no time grid", hint="time t:"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_spec(case: Case):
    text = mutate(case.spec, *case.edits)
    with pytest.raises(SpecError) as info:
        compile_text(text, case.spec)
    err = info.value
    assert type(err) is case.exc, f"{type(err).__name__}: {err.render()}"
    assert err.pos is not None, err.render()
    assert (err.pos.line, err.pos.col) == locate(text, case.at, after=case.after, shift=case.shift), err.render()
    assert case.message in err.message, err.render()
    if case.hint is not None:
        assert err.hint is not None and case.hint in err.hint, err.render()
    assert err.filename == f"specs/{case.spec}.dmft"


def test_enough_distinct_cases():
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({(c.spec, c.edits) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("misspelled-order-parameter", "missing-paren",
                                                                   "integral-s-le-t", "stray-at")],
                         ids=lambda c: c.id)
def test_render_format(case: Case):
    text = mutate(case.spec, *case.edits)
    with pytest.raises(SpecError) as info:
        compile_text(text, case.spec)
    err = info.value
    line, col = err.pos.line, err.pos.col
    rendered = err.render().splitlines()
    assert re.fullmatch(rf"specs/{case.spec}\.dmft:{line}:{col}: error: .+", rendered[0])
    assert rendered[0].endswith(err.message)
    src_line = text.splitlines()[line - 1]
    gutter, _, shown = rendered[1].partition(" | ")
    assert gutter.strip() == str(line) and shown == src_line
    caret_line = rendered[2]
    prefix = len(gutter) + len(" | ")
    assert caret_line.index("^") == prefix + col - 1
    assert set(caret_line[prefix + col:]) <= {"~"}
    if err.hint:
        assert rendered[-1] == f"  hint: {err.hint}"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_specs_parse_and_check(name):
    spec = parse(spec_text(name), f"specs/{name}.dmft")
    assert spec.model.name == name
    assert spec.time is not None and spec.orders and spec.actions
    model = check(spec)
    assert set(model.field_order) == {f.name for f in spec.fields}


def _token_deletions(text: str, count: int):
    """``count`` copies of ``text``, each with one token deleted (evenly spread over the spec body)."""
    body = text.index("\nmodel ")
    toks = list(re.finditer(r"[A-Za-z_][A-Za-z_0-9]*|[0-9.]+|<=|>=|\S", text[body:]))
    for k in range(count):
        m = toks[k * len(toks) // count]
        yield text[:body + m.start()] + text[body + m.end():]


@pytest.mark.parametrize("name", SHIPPED)
def test_token_deletions_never_escape(name):
    """Deleting one token gives a valid spec or a located SpecError, never a traceback (a sample of tokens)."""
    for text in _token_deletions(spec_text(name), count=30):
        try:
            compile_text(text, name)
        except SpecError as err:
            assert err.pos is not None, err.render()
            err.render()
