"""One definition of an activation: its SymPy expression, its derivatives through fourth order, and their code.

Every numerical path that needs phi and its derivatives (the deep march, the deep propagator's per-path
derivatives, the finite-width simulators of deep networks) gets them from here, either through a compiled
spec's generated module (whose functions are printed from :class:`Activation`) or, for the Python API
without a spec, from an expression such as ``"sin(h)"`` or ``"h / (1 + abs(h))"`` compiled by the same
printer.  There is no table of known activations in the numerical code: a few names (``tanh``, ``erf``,
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
from functools import cached_property, lru_cache

import sympy as sp

from dmftc.codegen.printer import ExprPrinter
from dmftc.frontend.builtins import ARITY, BUILTINS, SHORTHANDS

__all__ = ["Activation", "SiteActivation", "BUILTINS", "ARITY", "SHORTHANDS", "X", "as_activation", "MAX_ORDER"]

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
    """phi(x) as a SymPy expression in :data:`X`, with its derivatives and their printed code.

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

    def source(self, name: str = "activation") -> str:
        """Python source of ``name(x, width) -> (phi, phi', phi'', phi''', phi'''')`` in jax.numpy."""
        pr = _printer()
        lines = [f"def {name}(x, width):", f'    """phi(x) = {sp.sstr(self.expr)} and four derivatives."""']
        outs = []
        for k, d in enumerate(self.derivatives):
            code = pr(d)
            lines.append(f"    d{k} = {code if d.has(X) else f'jnp.full_like(x, {code})'}")
            outs.append(f"d{k}")
        lines.append(f"    return {', '.join(outs)}")
        return "\n".join(lines) + "\n"

    def site(self, width: float = 0.1) -> "SiteActivation":
        """The jit-able function h -> (phi, ..., phi'''') with delta functions of width ``width``."""
        ns = _namespace()
        exec(compile(self.source(), f"<activation {sp.sstr(self.expr)}>", "exec"), ns)
        fn = ns["activation"]
        w = float(width)
        return SiteActivation(key=("expr", sp.srepr(self.expr), w), label=self.text or sp.sstr(self.expr),
                              fn=lambda h: fn(h, w), kink_order=self.kink_order, linear=self.linear, width=w,
                              rewidth=self.site)


@dataclass(frozen=True)
class SiteActivation:
    """What the numerical code needs of an activation: ``fn(h) -> (phi, phi', phi'', phi''', phi'''')``
    (jax.numpy, elementwise), a hashable ``key`` for compilation caches, a label for messages, the order of
    the first derivative holding a (mollified) delta function, whether phi(h) = h, and the coefficients of
    a deep network's gradient field (:meth:`gradient`)."""

    key: tuple
    label: str
    fn: object = field(compare=False, hash=False)
    kink_order: int | None = None
    linear: bool = False
    width: float = 0.1
    rewidth: object = field(default=None, compare=False, hash=False, repr=False)
    # the gradient field g = a(h) z + b(h) of a deep network: h -> its coefficients (gradient()); None is
    # gradient descent, a = phi' and b = 0 (a compiled deep spec supplies its generated gradient())
    grad: object = field(default=None, compare=False, hash=False, repr=False)
    standard_gradient: bool = True
    # (generated module, parameter values) of the compiled deep spec this activation came from: its single-site
    # program is what the propagator differentiates (dmftc.runtime.site_local); None: the standard network's
    program: object = field(default=None, compare=False, hash=False, repr=False)

    def gradient(self, h):
        """(a, a', a'', a''', b, b', b'', b''') of the gradient field g = a(h) z + b(h) at h."""
        if self.grad is not None:
            return self.grad(h)
        _, d1, d2, d3, d4 = self.fn(h)
        zero = 0.0 * d1
        return d1, d2, d3, d4, zero, zero, zero, zero

    def at_width(self, width: float) -> "SiteActivation":
        """The same activation with delta functions of another width (for the extrapolation width -> 0)."""
        if self.rewidth is None:
            raise ValueError(f"activation {self.label} cannot change its delta width")
        return self.rewidth(width)

    def numpy(self, h):
        """fn on numpy arrays, numpy results."""
        import numpy as np

        return tuple(np.asarray(v) for v in self.fn(h))

    @property
    def smooth(self) -> bool:
        return self.kink_order is None


def as_activation(activation, width: float = 0.1) -> SiteActivation:
    """A SiteActivation from one, an :class:`Activation`, or an expression / shorthand string."""
    if isinstance(activation, SiteActivation):
        return activation
    if isinstance(activation, Activation):
        return activation.site(width)
    return _parsed(activation, float(width))


@lru_cache(maxsize=64)
def _parsed(text, width):
    return Activation.parse(text).site(width)


def _namespace():
    import jax
    import jax.numpy as jnp

    from dmftc.runtime import kernels as _k

    return {"jnp": jnp, "jax": jax, "_k": _k}


def _printer():
    """The expression printer of :mod:`dmftc.codegen.printer` with the activation's argument printed as ``x``."""
    class XPrinter(ExprPrinter):
        def atom(self, e):
            return "x" if e == X else None

    return XPrinter()
