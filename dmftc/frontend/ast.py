"""Syntax tree of a .dmft specification: frozen dataclasses with source positions.

The parser (:mod:`dmftc.frontend.parse`) builds these nodes; the checker
(:mod:`dmftc.frontend.check`) resolves names and validates them; nothing here knows about
SymPy or numerics.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dmftc.errors import Pos

# ----------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Expr:
    pos: Pos = field(compare=False, repr=False)


@dataclass(frozen=True)
class Num(Expr):
    value: float


@dataclass(frozen=True)
class Name(Expr):
    name: str


@dataclass(frozen=True)
class Indexed(Expr):
    """``Kx[mu, nu]``: an indexed parameter (no time argument)."""

    name: str
    indices: tuple[str, ...]


@dataclass(frozen=True)
class Call(Expr):
    """``f[idx](args)``: a function call, or an order parameter/field at a time."""

    name: str
    indices: tuple[str, ...]
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class PrimeCall(Expr):
    """``phi'(x)``: derivative of an activation."""

    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Hat(Expr):
    """``hat K[mu,nu](t)``: the dual of an order parameter."""

    name: str
    indices: tuple[str, ...]
    time: str
    time2: str | None = None      # dual of a two-time kernel of a deep action, hat Phi[l](t, s)


@dataclass(frozen=True)
class BinOp(Expr):
    op: str  # one of + - * / ^
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg(Expr):
    operand: Expr


@dataclass(frozen=True)
class Integral(Expr):
    """``integral(body, s < t)`` (causal, eta * sum_{s<t}) or ``integral(body, t)``."""

    body: Expr
    var: str
    cmp: str | None
    upper: str | None


@dataclass(frozen=True)
class IndexSum(Expr):
    indices: tuple[str, ...]
    body: Expr


@dataclass(frozen=True)
class Expectation(Expr):
    """``E[body]`` over the single-site process; ``log E[...]`` when ``log`` is set."""

    body: Expr
    log: bool


@dataclass(frozen=True)
class Matrix(Expr):
    rows: tuple[Expr, ...]


@dataclass(frozen=True)
class TimeSum(Expr):
    """``sum(s < t: body)``: the plain sum over earlier steps (no factor eta); deep specs only."""

    var: str
    cmp: str
    upper: str
    body: Expr


@dataclass(frozen=True)
class LayerSum(Expr):
    """``sum(l = 0..L: body)``: a sum over layer numbers; ``lo``/``hi`` are layer index texts."""

    var: str
    lo: str
    hi: str
    body: Expr


@dataclass(frozen=True)
class Response(Expr):
    """``E[d of / d wrt]``: the average derivative of a field expression with respect to a source."""

    of: Expr
    wrt: Expr


# ----------------------------------------------------------------- statements


@dataclass(frozen=True)
class Stmt:
    pos: Pos = field(compare=False, repr=False)


@dataclass(frozen=True)
class ModelDecl(Stmt):
    name: str
    description: str


@dataclass(frozen=True)
class ParamDecl(Stmt):
    name: str
    dims: tuple[str, ...]
    default: Expr
    description: str


@dataclass(frozen=True)
class TimeDecl(Stmt):
    var: str
    steps_name: str
    steps: int
    step_name: str
    step: Expr


@dataclass(frozen=True)
class IndexDecl(Stmt):
    names: tuple[str, ...]
    start: int
    size: str


@dataclass(frozen=True)
class ActivationDecl(Stmt):
    name: str
    arg: str
    body: Expr


@dataclass(frozen=True)
class OrderDecl(Stmt):
    name: str
    indices: tuple[str, ...]
    time: str
    time2: str | None = None      # second time argument of a two-time kernel, Phi[l](t, s)


@dataclass(frozen=True)
class SourceTarget(Stmt):
    name: str
    indices: tuple[str, ...]


@dataclass(frozen=True)
class SourceDecl(Stmt):
    targets: tuple[SourceTarget, ...]
    mean: Expr
    cov: Expr
    kind: str = "normal"          # "normal" (time-independent) or "gp" (a Gaussian process over time)


@dataclass(frozen=True)
class FieldDecl(Stmt):
    name: str
    indices: tuple[str, ...]
    time: str
    body: Expr
    time2: str | None = None      # definitions of two-time kernels and responses, A[l](t, s) = ...


@dataclass(frozen=True)
class InitialDecl(Stmt):
    """``h(0) = u``, ``v(-1) = 0``: the initial value of a field written in recurrence form."""

    name: str
    time: int
    body: Expr


@dataclass(frozen=True)
class ActionDecl(Stmt):
    body: Expr


@dataclass(frozen=True)
class LayersDecl(Stmt):
    """``layers l = 1..L``: the layer index of a deep network and its depth parameter."""

    var: str
    start: int
    depth: str
    description: str


@dataclass(frozen=True)
class Spec:
    """A parsed specification, statements in source order."""

    filename: str
    source: str
    model: ModelDecl
    params: tuple[ParamDecl, ...]
    time: TimeDecl | None
    indices: tuple[IndexDecl, ...]
    activations: tuple[ActivationDecl, ...]
    orders: tuple[OrderDecl, ...]
    sources: tuple[SourceDecl, ...]
    fields: tuple[FieldDecl, ...]
    actions: tuple[ActionDecl, ...]
    process_pos: Pos | None = None
    layers: tuple[LayersDecl, ...] = ()
    initials: tuple[InitialDecl, ...] = ()


def walk(expr: Expr):
    """Yield ``expr`` and all sub-expressions, depth first, in source order."""
    yield expr
    if isinstance(expr, (Call, PrimeCall)):
        for a in expr.args:
            yield from walk(a)
    elif isinstance(expr, BinOp):
        yield from walk(expr.left)
        yield from walk(expr.right)
    elif isinstance(expr, Neg):
        yield from walk(expr.operand)
    elif isinstance(expr, (Integral, IndexSum, Expectation, TimeSum, LayerSum)):
        yield from walk(expr.body)
    elif isinstance(expr, Matrix):
        for r in expr.rows:
            yield from walk(r)
    elif isinstance(expr, Response):
        yield from walk(expr.of)
        yield from walk(expr.wrt)


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3}


def to_text(e: Expr, prec: int = 0) -> str:
    """Spec-like text of an expression, parenthesised where precedence needs it (``...`` for statements)."""
    if isinstance(e, Num):
        return f"{e.value:g}"
    if isinstance(e, Name):
        return e.name
    if isinstance(e, BinOp):
        p = _PREC[e.op]
        right = to_text(e.right, p + (e.op in "-/^"))
        text = f"{to_text(e.left, p)} {right}" if e.op == "*" else f"{to_text(e.left, p)} {e.op} {right}"
        return f"({text})" if p < prec else text
    if isinstance(e, Neg):
        return f"-{to_text(e.operand, 3)}"
    if isinstance(e, Matrix):
        return "[" + ", ".join(to_text(r) for r in e.rows) + "]"
    if isinstance(e, Call):
        idx = f"[{', '.join(e.indices)}]" if e.indices else ""
        return f"{e.name}{idx}({', '.join(to_text(a) for a in e.args)})"
    if isinstance(e, PrimeCall):
        return f"{e.name}'({', '.join(to_text(a) for a in e.args)})"
    if isinstance(e, Indexed):
        return f"{e.name}[{', '.join(e.indices)}]"
    if isinstance(e, Hat):
        idx = f"[{', '.join(e.indices)}]" if e.indices else ""
        return f"hat {e.name}{idx}({e.time}{', ' + e.time2 if e.time2 else ''})"
    if isinstance(e, Expectation):
        return f"{'log ' if e.log else ''}E[{to_text(e.body)}]"
    if isinstance(e, Response):
        return f"E[d {to_text(e.of)} / d {to_text(e.wrt)}]"
    if isinstance(e, LayerSum):
        return f"sum({e.var} = {e.lo}..{e.hi}: {to_text(e.body)})"
    if isinstance(e, TimeSum):
        return f"sum({e.var} {e.cmp} {e.upper}: {to_text(e.body)})"
    if isinstance(e, IndexSum):
        return f"sum({', '.join(e.indices)}: {to_text(e.body)})"
    if isinstance(e, Integral):
        rng = f"{e.var} {e.cmp} {e.upper}" if e.cmp else e.var
        return f"integral({to_text(e.body)}, {rng})"
    return "..."


def signed_terms(e: Expr, sign: int = 1):
    """(sign, term) of the top-level terms of a sum, differences and negations unfolded."""
    if isinstance(e, BinOp) and e.op in "+-":
        yield from signed_terms(e.left, sign)
        yield from signed_terms(e.right, sign if e.op == "+" else -sign)
    elif isinstance(e, Neg):
        yield from signed_terms(e.operand, -sign)
    else:
        yield sign, e


def children(e) -> tuple:
    """The direct subexpressions of an expression (none for a leaf)."""
    if isinstance(e, (Call, PrimeCall)):
        return e.args
    if isinstance(e, BinOp):
        return (e.left, e.right)
    if isinstance(e, Neg):
        return (e.operand,)
    if isinstance(e, (Integral, IndexSum, Expectation, TimeSum, LayerSum)):
        return (e.body,)
    if isinstance(e, Matrix):
        return e.rows
    if isinstance(e, Response):
        return (e.of, e.wrt)
    return ()
