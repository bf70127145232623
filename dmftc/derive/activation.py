"""One definition of an activation: its SymPy expression and its derivatives through fourth order.

Every numerical path that needs phi and its derivatives (the deep march, the deep propagator's per-path
derivatives, the finite-width simulators of deep networks) gets them from here, either through a compiled
spec's generated module (whose functions are printed from :class:`Activation`) or, for the Python API
without a spec, from an expression such as ``"sin(h)"`` or ``"h / (1 + abs(h))"`` printed by
:mod:`dmftc.codegen.activation` and run by :mod:`dmftc.runtime.problem.activation`.  There is no table of known activations in the numerical code: a few names (``tanh``, ``erf``,
``linear``, ``relu``) are accepted as shorthands for their expressions, nothing more.

Non-smooth activations.  Derivatives are taken in the sense of distributions: phi is split at its kinks
(where an abs, max, min, sign or Heaviside switches) into smooth branches; each derivative differentiates the
branches and adds, at every kink, a delta function weighted by the jump of the previous order.  So the
third derivative of softsign h / (1 + |h|) is 6 / (1 + |h|)^4 branch-wise minus 4 delta(h), and no product
of delta functions can appear.  Pathwise estimators cannot sample a delta
function: in code it is replaced by a Gaussian of width ``width`` (and its derivatives by the Gaussian's),
a biased approximation whose order is :attr:`Activation.kink_order` (the lowest derivative with a delta).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import sympy as sp

from dmftc.frontend.builtins import BUILTINS, SHORTHANDS

__all__ = ["Activation", "X", "MAX_ORDER", "derivatives"]

X = sp.Symbol("x", real=True)
MAX_ORDER = 4

# what the expression parser may see besides BUILTINS: number and name constructors only (no SymPy namespace,
# where beta, gamma, E, N, S ... would be functions or constants)
_PARSE_GLOBALS = {"Integer": sp.Integer, "Float": sp.Float, "Rational": sp.Rational, "Symbol": sp.Symbol,
                  "Function": sp.Function}


def _pieces(expr):
    """(kinks, branches): the sorted real points where ``expr`` may be non-smooth, and the smooth expression
    on each of the len(kinks) + 1 intervals between them; None when the kinks are not finitely many numbers
    (parameters, periodic kinks): then the caller differentiates plainly (SymPy's DiracDelta of the switching
    expression, mollified in code as a function of it)."""
    pw = sp.piecewise_fold(expr.rewrite(sp.Piecewise))
    if not isinstance(pw, sp.Piecewise):
        return [], [expr]
    kinks = set()
    for rel in pw.atoms(sp.core.relational.Relational):
        roots = sp.solveset(rel.lhs - rel.rhs, X, domain=sp.S.Reals)
        if not isinstance(roots, sp.FiniteSet):       # infinitely many kinks (abs(sin(h))) or unknown
            return None
        for root in roots:
            if not (root.is_number and root.is_real):
                return None
            kinks.add(sp.nsimplify(root))
    kinks = sorted(kinks, key=float)
    if not kinks:
        return [], [expr]
    probes = [kinks[0] - 1] + [(a + b) / 2 for a, b in zip(kinks[:-1], kinks[1:])] + [kinks[-1] + 1]
    branches = []
    for m in probes:
        for e, c in pw.args:
            if bool(c.subs(X, m)):
                branches.append(sp.simplify(e))
                break
        else:  # pragma: no cover (a Piecewise from rewrite ends with a True branch)
            return None
    return kinks, branches


@dataclass(frozen=True)
class _Distribution:
    """sum_i [x in interval i] branches[i](x) + sum_(x0, k, c) c delta^(k)(x - x0)."""

    kinks: tuple
    branches: tuple
    deltas: tuple = ()          # ((x0, k, coefficient), ...)

    def derivative(self) -> "_Distribution":
        acc = {}
        for x0, k, c in self.deltas:
            acc[(x0, k + 1)] = acc.get((x0, k + 1), 0) + c
        for i, x0 in enumerate(self.kinks):      # jump of the branches at each kink
            jump = sp.simplify(self.branches[i + 1].subs(X, x0) - self.branches[i].subs(X, x0))
            if jump != 0:
                acc[(x0, 0)] = acc.get((x0, 0), 0) + jump
        deltas = tuple((x0, k, sp.simplify(c)) for (x0, k), c in
                       sorted(acc.items(), key=lambda kv: (float(kv[0][0]), kv[0][1])) if sp.simplify(c) != 0)
        return _Distribution(self.kinks, tuple(sp.simplify(sp.diff(b, X)) for b in self.branches), deltas)

    def expr(self):
        """One SymPy expression: a Piecewise over the intervals (equal neighbours merged) plus delta terms."""
        pairs = []
        for i, b in enumerate(self.branches):
            cond = X < self.kinks[i] if i < len(self.kinks) else sp.true
            if pairs and sp.simplify(pairs[-1][0] - b) == 0:
                pairs[-1] = (b, cond)
            else:
                pairs.append((b, cond))
        regular = pairs[0][0] if len(pairs) == 1 else sp.Piecewise(*pairs)
        return regular + sp.Add(*[c * (sp.DiracDelta(X - x0, k) if k else sp.DiracDelta(X - x0))
                                  for x0, k, c in self.deltas])


def derivatives(expr, orders: int = MAX_ORDER) -> tuple:
    """(phi, phi', ..., phi^(orders)) in the sense of distributions (module doc): smooth branches between
    the kinks, and delta functions at the kinks for the jumps of the previous order."""
    expr = sp.sympify(expr)
    split = _pieces(expr)
    if split is None or not split[0]:            # smooth, or kinks that depend on parameters: plain derivatives
        return (expr,) + tuple(sp.diff(expr, X, k) for k in range(1, orders + 1))
    dist, out = _Distribution(tuple(split[0]), tuple(split[1])), [expr]
    for _ in range(orders):
        dist = dist.derivative()
        out.append(dist.expr())
    return tuple(out)


@dataclass(frozen=True)
class Activation:
    """phi(x) as a SymPy expression in :data:`X`, with its derivatives.

    ``text`` is what the user wrote (for messages); equality and hashing use the expression only."""

    expr: sp.Expr
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> "Activation":
        """An expression in ``h`` (or ``x``) over the DSL's functions, e.g. ``"h / (1 + abs(h))"``; or a shorthand."""
        from tokenize import TokenError

        from sympy.parsing.sympy_parser import parse_expr

        from dmftc.errors import ParameterError

        if not isinstance(text, str) or not text.strip():
            raise ParameterError(f"an activation is an expression in h such as 'tanh(h)', got {text!r}")
        src = SHORTHANDS.get(text.strip(), text)
        names = {k: v for k, v in BUILTINS.items()} | {"h": X, "x": X, "pi": sp.pi}
        try:
            expr = parse_expr(src.replace("^", "**"), local_dict=names, global_dict=dict(_PARSE_GLOBALS))
        except (sp.SympifyError, SyntaxError, TypeError, ValueError, TokenError) as err:
            raise ParameterError(f"cannot read the activation {text!r}: {err}; write an expression in h such as "
                                 f"'tanh(h)' or 'h / (1 + abs(h))' (functions: {', '.join(BUILTINS)})") from None
        if not isinstance(expr, sp.Expr):
            raise ParameterError(f"the activation {text!r} is not an expression in h; write it applied to h, "
                                 f"e.g. '{text.strip()}(h)'")
        unknown = sorted({str(f.func) for f in expr.atoms(sp.core.function.AppliedUndef)})
        if unknown:
            raise ParameterError(f"the activation {text!r} uses unknown functions {', '.join(unknown)}; "
                                 f"known: {', '.join(BUILTINS)}")
        free = expr.free_symbols - {X}
        if free:
            raise ParameterError(f"the activation {text!r} depends on {', '.join(sorted(map(str, free)))}; "
                                 "only h is allowed (write parameters into a spec)")
        return cls(expr, text)

    @cached_property
    def derivatives(self) -> tuple:
        return derivatives(self.expr)

    @property
    def linear(self) -> bool:
        return sp.simplify(self.expr - X) == 0

    @property
    def kink_order(self) -> int | None:
        """Lowest derivative order (<= 4) that holds a delta function, None for an activation smooth to 4th order."""
        for k, d in enumerate(self.derivatives):
            if d.has(sp.DiracDelta):
                return k
        return None
