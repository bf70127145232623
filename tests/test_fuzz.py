"""Property-based fuzzing of the front end and code generation.

Random textual mutations of the shipped specs (token deletions, insertions of
tokens from the spec's own vocabulary and punctuation, truncations, swaps of
adjacent tokens, renamings of an identifier at one or all occurrences,
duplicated and deleted lines, and splices of small expressions around an
identifier) are run through parse -> check -> derive -> lower -> emit.  Every
outcome must be either generated code that is valid Python, or a
:class:`SpecError` with a source location that renders; any other exception
escaping the compiler is a bug.  A second property uses edits that mostly keep
a spec valid (renamings, numbers, activations), so that many mutants reach the
code generator.  The escapes the fuzzer found are kept as regression cases at
the end of the file.

The examples are derandomized, so the suite is deterministic.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from dmftc.frontend.check import check
from dmftc.derive import derive
from dmftc.codegen.two_layer import emit
from dmftc.errors import SpecError
from dmftc.codegen.lower import lower
from dmftc.frontend.parse import parse

SPECS = Path(__file__).resolve().parent.parent / "specs"
SHIPPED = ("eos", "linear_whitened", "two_layer", "two_layer_multi")
TEXTS = {name: (SPECS / f"{name}.dmft").read_text() for name in SHIPPED}

_TOKEN = re.compile(r'"[^"\n]*"|#[^\n]*|[A-Za-z_][A-Za-z_0-9]*|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?'
                    r"|<=|>=|\.\.|\n|[^\s]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
PUNCTUATION = ("(", ")", "[", "]", ",", ":", ";", "=", "~", "+", "-", "*", "/", "^", "<", "<=", ">", ">=", "..",
               "'", '"', "#", "\n", "0", "1", "2.5", "1e-3", "{", "!", "@", ".")
FRESH_NAMES = ("x", "s", "t", "mu", "hat", "E", "log", "integral", "sum", "normal", "tanh", "eye", "pi", "phi",
               "order", "param", "process", "action", "model", "index", "time", "steps", "of", "in", "u_star2")


def tokens(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the tokens of ``text`` (comments, strings and newlines are tokens)."""
    return [m.span() for m in _TOKEN.finditer(text)]


def vocabulary(text: str) -> list[str]:
    return sorted({text[a:b] for a, b in tokens(text)})


def identifiers(text: str) -> list[str]:
    """Identifiers outside comments and strings."""
    return sorted({text[a:b] for a, b in tokens(text) if _IDENT.fullmatch(text[a:b])})


# ------------------------------------------------------------------ mutations
# Each mutation is a function (text, draw) -> (new text, description).

def m_delete_token(text, draw):
    toks = tokens(text)
    if not toks:
        return text, "no token"
    a, b = toks[draw(st.integers(0, len(toks) - 1))]
    return text[:a] + text[b:], f"delete {text[a:b]!r} at {a}"


def m_insert_token(text, draw):
    toks = tokens(text)
    at = draw(st.sampled_from([a for a, _ in toks] + [len(text)]))
    tok = draw(st.sampled_from(vocabulary(text) + list(PUNCTUATION)))
    pad = draw(st.sampled_from(["", " "]))
    return text[:at] + tok + pad + text[at:], f"insert {tok!r} at {at}"


def m_truncate(text, draw):
    at = draw(st.integers(0, len(text)))
    return text[:at], f"truncate at {at}"


def m_swap(text, draw):
    toks = tokens(text)
    if len(toks) < 2:
        return text, "no swap"
    i = draw(st.integers(0, len(toks) - 2))
    (a, b), (c, d) = toks[i], toks[i + 1]
    return text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:], f"swap {text[a:b]!r} {text[c:d]!r} at {a}"


def m_rename(text, draw):
    names = identifiers(text)
    if not names:
        return text, "no rename"
    old = draw(st.sampled_from(names))
    new = draw(st.sampled_from(sorted(set(names) | set(FRESH_NAMES) | {old + "2", old[:-1] or "y", old.upper()})))
    spans = [(a, b) for a, b in tokens(text) if text[a:b] == old]
    if draw(st.booleans()):  # every occurrence
        for a, b in reversed(spans):
            text = text[:a] + new + text[b:]
        return text, f"rename {old!r} -> {new!r} everywhere"
    a, b = spans[draw(st.integers(0, len(spans) - 1))]
    return text[:a] + new + text[b:], f"rename {old!r} -> {new!r} at {a}"


def m_duplicate_line(text, draw):
    lines = text.splitlines(keepends=True)
    if not lines:
        return text, "no line"
    i = draw(st.integers(0, len(lines) - 1))
    line = lines[i] if lines[i].endswith("\n") else lines[i] + "\n"
    return "".join(lines[:i + 1] + [line] + lines[i + 1:]), f"duplicate line {i + 1}"


def m_delete_line(text, draw):
    lines = text.splitlines(keepends=True)
    if not lines:
        return text, "no line"
    i = draw(st.integers(0, len(lines) - 1))
    return "".join(lines[:i] + lines[i + 1:]), f"delete line {i + 1}"


_TEMPLATES = ("{x}^2", "{x}^{y}", "abs({x})", "phi'({x})", "max({x}, 0)", "min({x}, {y})", "({x} / {y})",
              "exp(-{x})", "sqrt({x})", "log({x})", "erf({x})", "{x} {y}", "{x} * {y}(t)", "sum(nu: {x})",
              "sum(mu, nu: {x})", "integral({x}, s < t)", "integral({y}(s) {x}, s < t)", "{y}(s)", "{y}(t)",
              "{y}[mu]", "{y}[mu](t)", "{y}[nu](s)", "hat {y}(t)", "hat {y}[mu](t)", "E[{x}]",
              "log E[exp(-{x})]", "[[{x}, 1], [1, {x}]]", "[{x}, {y}]", "{x}(s)", "{x}'({y})", "0 * {x}", "-{x}")


def m_splice(text, draw):
    """Replace one identifier with a small expression built around it and another name of the spec."""
    spans = [(a, b) for a, b in tokens(text) if _IDENT.fullmatch(text[a:b])]
    if not spans:
        return text, "no splice"
    a, b = draw(st.sampled_from(spans))
    y = draw(st.sampled_from(identifiers(text)))
    new = draw(st.sampled_from(_TEMPLATES)).format(x=text[a:b], y=y)
    return text[:a] + new + text[b:], f"splice {text[a:b]!r} -> {new!r} at {a}"


MUTATIONS = (m_delete_token, m_insert_token, m_truncate, m_swap, m_rename, m_duplicate_line, m_delete_line,
             m_splice)


@st.composite
def mutated_specs(draw, mutations=MUTATIONS, max_edits=3):
    name = draw(st.sampled_from(SHIPPED))
    text = TEXTS[name]
    log = []
    for _ in range(draw(st.integers(1, max_edits))):
        if not text.strip():
            break
        mutate = draw(st.sampled_from(mutations))
        if mutate is m_truncate and text and draw(st.integers(0, 3)):
            continue  # truncation ends most specs early: keep it rarer than the other edits
        text, what = mutate(text, draw)
        log.append(what)
    return name, text, log


# ------------------------------------------------------------------ the property

def compile_text(text: str, name: str) -> str | None:
    """Generated source for ``text``, or None after a well-formed SpecError; anything else propagates."""
    filename = f"specs/{name}.dmft"
    try:
        d = derive(check(parse(text, filename)))
        code = emit(d, lower(d), spec_path=filename, spec_sha256="0" * 64)
    except SpecError as err:
        assert err.pos is not None, f"SpecError without a location: {err.message}"
        assert err.pos.line >= 1 and err.pos.col >= 1, err.pos
        assert err.pos.line <= text.count("\n") + 2, (err.pos, err.message)
        rendered = err.render()
        assert isinstance(rendered, str) and f":{err.pos.line}:{err.pos.col}: error: " in rendered
        return None
    assert isinstance(code, str)
    compile(code, f"<generated from mutated {name}>", "exec")
    return code


FUZZ = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@FUZZ
@given(mutated_specs())
def test_mutated_specs_compile_or_fail_with_located_spec_error(case):
    name, text, log = case
    event("compiles" if compile_text(text, name) is not None else "located SpecError")


# Edits that mostly keep a spec valid, so that the code generator sees many compiling variants.
def m_rename_all_fresh(text, draw):
    names = [n for n in identifiers(text) if n not in ("model", "param", "time", "steps", "of", "index", "in",
                                                         "activation", "order", "process", "action", "normal",
                                                         "hat", "integral", "sum", "log", "E", "exp", "tanh",
                                                         "max", "sqrt", "eye")]
    if not names:
        return text, "no rename"
    old = draw(st.sampled_from(names))
    new = old + draw(st.sampled_from(["_1", "x", "Q"]))
    return re.sub(rf"(?<![A-Za-z_0-9]){re.escape(old)}(?![A-Za-z_0-9])", new, text), f"rename {old} -> {new}"


def m_edit_number(text, draw):
    nums = [(a, b) for a, b in tokens(text) if re.fullmatch(r"[0-9][0-9.eE+-]*", text[a:b])]
    if not nums:
        return text, "no number"
    a, b = draw(st.sampled_from(nums))
    new = draw(st.sampled_from(["0", "1", "2", "0.5", "3", "1e-3", "7"]))
    return text[:a] + new + text[b:], f"number {text[a:b]} -> {new} at {a}"


def m_activation(text, draw):
    body = draw(st.sampled_from(["relu(h)", "erf(h)", "sigmoid(h)", "h", "h^2", "sin(h) * cos(h)", "abs(h)",
                                 "min(h, 1)", "exp(-h^2)", "log(1 + exp(h))", "max(h, -h / 2)"]))
    new = re.sub(r"(activation phi\(h\) = )[^\n]*", lambda m: m.group(1) + body, text)
    return new, f"activation {body}"


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_specs(mutations=(m_rename_all_fresh, m_edit_number, m_activation, m_delete_line,
                                m_duplicate_line), max_edits=2))
@example(("two_layer", TEXTS["two_layer"], []))
def test_compiling_mutants_generate_valid_python(case):
    name, text, log = case
    code = compile_text(text, name)
    event("compiles" if code is not None else "located SpecError")
    if code is not None:
        assert "def coefficients(" in code and "def site_field_" in code
        assert "\nSITE = {" in code, "no single-site program, which the solver marches"


def test_unmutated_specs_compile():
    for name in SHIPPED:
        assert compile_text(TEXTS[name], name) is not None, name


@pytest.mark.parametrize("name", SHIPPED)
def test_every_prefix_of_a_line_boundary_is_handled(name):
    """Truncating a spec after each of its lines is a located error or a valid (smaller) spec."""
    text = TEXTS[name]
    for end in [m.end() for m in re.finditer("\n", text)]:
        compile_text(text[:end], name)


# ------------------------------------------------------------------ regressions: escapes the fuzzer found
# Fixed copies of two shipped specs, so that these cases do not depend on later edits of specs/.
from spec_texts import EOS as SCALAR  # noqa: E402  (the eos spec with T = 40, eta = 0.5)
MULTI = """\
model two_layer_multi "two-layer ReLU net on P points"
param P = 4
param Kx[P, P] = 0.7 * eye(P) + 0.3
param y[P] = 1.0
param gamma = 1.0
time t: T = 100 steps of eta = 0.02
index mu, nu in 1..P
activation phi(h) = sqrt(2) * max(0, h)
order Delta[mu](t), K[mu, nu](t)
process:
  u[mu] ~ normal(0, Kx)
  r ~ normal(0, 1)
  h[mu](t) = u[mu] + gamma * integral(sum(nu: Kx[mu, nu] * Delta[nu](s) * g[nu](s)), s < t)
  z(t) = r + gamma * integral(sum(nu: Delta[nu](s) * phi(h[nu](s))), s < t)
  g[mu](t) = phi'(h[mu](t)) * z(t)
action:
    integral(sum(mu, nu: hat K[mu, nu](t) K[mu, nu](t)), t)
  + integral(sum(mu: hat Delta[mu](t) (Delta[mu](t) - y[mu]
                                       + integral(sum(nu: K[mu, nu](s) Delta[nu](s)), s < t))), t)
  + log E[exp(-integral(sum(mu, nu: hat K[mu, nu](t) (phi(h[mu](t)) phi(h[nu](t))
                                                     + Kx[mu, nu] g[mu](t) g[nu](t))), t))]
"""
_DEEP_TANH = "tanh(" * 150 + "gamma" + ")" * 150

# (id, base text, [(old, new)], None if it must compile, else (message fragment, text at the reported location))
REGRESSIONS = [
    ("abs-activation-indexed", MULTI, [("sqrt(2) * max(0, h)", "abs(h)")], None),
    ("abs-of-indexed-field", MULTI, [("Kx[mu, nu] g[mu](t) g[nu](t)", "abs(h[mu](t)) abs(h[nu](t))")], None),
    ("exp-of-one", SCALAR, [("h(t) = u +", "h(t) = exp(1) * u +")], None),
    ("delta-derivative", MULTI, [("activation phi(h) = sqrt(2) * max(0, h)",
                                  "activation phi(h) = relu(h)\nactivation psi(h) = phi'(h)"),
                                 ("g[mu](t) = phi'", "g[mu](t) = psi'")], ("delta function", "g[mu](t)")),
    ("product-of-integrals", SCALAR, [("u + gamma * integral", "u + integral(gamma, s < t) * integral")],
     ("affine in its causal integrals", "integral(gamma")),
    ("power-of-integral", SCALAR, [("h(t) = u + gamma * integral(Delta(s) * z(s), s < t)",
                                    "h(t) = (u + gamma * integral(Delta(s) * z(s), s < t))^2")],
     ("affine in its causal integrals", "integral(Delta(s) * z(s)")),
    ("division-by-zero", SCALAR, [("h(t) = u +", "h(t) = u / 0 +")], ("undefined", "u / 0")),
    ("log-of-zero", SCALAR, [("h(t) = u +", "h(t) = log(0) * u +")], ("undefined", "log(0)")),
    ("sqrt-of-negative", SCALAR, [("h(t) = u +", "h(t) = sqrt(-1) * u +")], ("not a real number", "sqrt(-1)")),
    ("nan-constraint", MULTI, [("(Delta[mu](t) - y[mu]", "(0 ^ y[mu] + Delta[mu](t) - y[mu]")],
     ("undefined", "Delta[mu](t)")),
    ("huge-literal", SCALAR, [("h(t) = u +", "h(t) = 1e999 * u +")], ("too large", "1e999")),
    ("power-tower", SCALAR, [("h(t) = u +", "h(t) = 2^2^2^2^2 * u +")], ("floating-point range", "2^2^2")),
    ("huge-power", SCALAR, [("h(t) = u +", "h(t) = 9^9^8 * u +")], ("floating-point range", "9^9^8")),
    ("tiny-power", SCALAR, [("h(t) = u +", "h(t) = 0.5^(10^30) * u +")], ("floating-point range", "0.5^")),
    ("huge-power-of-constraint", SCALAR, [("(Delta(t) - y)", "(Delta(t) - y)^100000")],
     ("not linear", "Delta(t), K(t)")),
    ("deep-nesting", SCALAR, [("h(t) = u +", f"h(t) = u * {_DEEP_TANH} +")], ("nested too deeply", "tanh(")),
    ("long-sum", SCALAR, [("h(t) = u +", "h(t) = u + " + " + ".join(["gamma"] * 3000) + " +")],
     ("nested too deeply", "gamma")),
    ("many-minus-signs", SCALAR, [("h(t) = u +", "h(t) = u + " + "-" * 3000 + "gamma +")],
     ("nested too deeply", "-")),
    ("source-in-integrand", MULTI, [("z(t) = r +", "z(t) = integral(r, s < t) +")],
     ("cannot be integrated", "r, s < t")),
    ("time-in-activation", MULTI, [("max(0, h)", "max(0, t)")], ("time variable 't'", "t)")),
]


@pytest.mark.parametrize("base, edits, expect", [c[1:] for c in REGRESSIONS], ids=[c[0] for c in REGRESSIONS])
def test_regressions(base, edits, expect):
    text = base
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    if expect is None:
        assert compile_text(text, "regression") is not None
        return
    fragment, at = expect
    with pytest.raises(SpecError) as info:
        d = derive(check(parse(text, "specs/regression.dmft")))
        emit(d, lower(d), spec_path="specs/regression.dmft", spec_sha256="0" * 64)
    err = info.value
    assert fragment in err.message, err.render()
    assert err.pos is not None
    line = text.splitlines()[err.pos.line - 1]
    assert line[err.pos.col - 1:].startswith(at), err.render()
    assert compile_text(text, "regression") is None  # and the property's own checks hold
