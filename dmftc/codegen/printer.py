"""The expression printer shared by the code generators and the activation's compiled functions: SymPy
expression -> JAX source text (:class:`ExprPrinter`), and the pruning of a generated module's header imports.
It depends on SymPy only, so the derivation stages can print without importing the code generators."""
from __future__ import annotations

import re

import sympy as sp

_FUNCS = {sp.tanh: "jnp.tanh", sp.exp: "jnp.exp", sp.log: "jnp.log", sp.sin: "jnp.sin", sp.cos: "jnp.cos",
          sp.Abs: "jnp.abs", sp.erf: "jax.scipy.special.erf", sp.sign: "jnp.sign", sp.cosh: "jnp.cosh",
          sp.sinh: "jnp.sinh"}


_IMPORTS = (("import jax\n", r"\bjax\.(?!numpy\b|scipy\b)"), ("import jax.numpy as jnp\n", r"\bjnp\."),
            ("import jax.scipy.special  # noqa: F401\n", r"\bjax\.scipy\.special\."),
            ("import numba\n", r"\bnumba\."), ("import numpy as np\n", r"(?<![A-Za-z_.])np\."),
            ("from dmftc.runtime.numerics import kernels as _k\n", r"\b_k\."))


def prune_imports(text: str) -> str:
    """Drop the header imports that a generated module does not use."""
    head_end = text.index('"""', text.index('"""') + 3) + 3       # imports follow the module docstring
    head, body = text[:head_end], text[head_end:]
    for line, use in _IMPORTS:
        if not re.search(use, body.replace(line, "")):
            body = body.replace(line, "", 1)
    return head + body.replace("\n\n\nMODEL = ", "\n\nMODEL = ", 1)


class ExprPrinter:
    """SymPy expression -> JAX source text: numbers, arithmetic, the elementwise functions of _FUNCS,
    Heaviside / DiracDelta (mollified, width ``dirac_width``), Max, Min, Piecewise.  Subclasses print the
    model's own atoms (symbols, indexed order parameters, sums) in ``atom``, which returns None for the rest."""

    dirac_width = "width"

    def atom(self, e):
        return None

    def __call__(self, e) -> str:
        return self.p(e)

    def p(self, e) -> str:
        own = self.atom(e)
        if own is not None:
            return own
        if isinstance(e, sp.Integer):
            return f"{float(e)!r}"
        if isinstance(e, sp.Rational):
            return f"({float(e.p)!r} / {float(e.q)!r})"
        if isinstance(e, sp.Float):
            return repr(float(e))
        if e is sp.pi:
            return "jnp.pi"
        if e is sp.E:
            return "jnp.e"
        if isinstance(e, sp.Add):
            return "(" + " + ".join(self.p(a) for a in _sorted_args(e)) + ")"
        if isinstance(e, sp.Mul):
            num, den = [], []
            for a in _sorted_args(e):
                if isinstance(a, sp.Pow) and a.exp.is_Integer and a.exp < 0:
                    den.append(self.p(a.base ** (-a.exp)))
                elif a == -1:
                    num.insert(0, "-1.0")
                else:
                    num.append(self.p(a))
            s = " * ".join(num) if num else "1.0"
            return f"({s} / ({' * '.join(den)}))" if den else f"({s})"
        if isinstance(e, sp.Pow):
            if e.exp == sp.Rational(1, 2):
                return f"jnp.sqrt({self.p(e.base)})"
            if e.exp.is_Integer and e.exp > 0:
                return f"({self.p(e.base)} ** {int(e.exp)})"
            return f"({self.p(e.base)} ** {self.p(e.exp)})"
        if isinstance(e, sp.Heaviside):
            return f"_k.heaviside({self.p(e.args[0])})"
        if isinstance(e, sp.DiracDelta):
            k = int(e.args[1]) if len(e.args) > 1 else 0
            return f"_k.dirac({self.p(e.args[0])}, {self.dirac_width}{f', {k}' if k else ''})"
        if isinstance(e, sp.Max):
            return self._fold("jnp.maximum", e.args)
        if isinstance(e, sp.Min):
            return self._fold("jnp.minimum", e.args)
        if isinstance(e, sp.Piecewise):
            out = "jnp.nan"
            for expr, cond in reversed(e.args):
                out = self.p(expr) if cond is sp.true else f"jnp.where({self._cond(cond)}, {self.p(expr)}, {out})"
            return out
        if e.func in _FUNCS:
            return f"{_FUNCS[e.func]}({', '.join(self.p(a) for a in e.args)})"
        raise NotImplementedError(f"cannot print {e.func.__name__}: {e}")

    def _cond(self, c):
        ops = {sp.StrictGreaterThan: ">", sp.StrictLessThan: "<", sp.GreaterThan: ">=", sp.LessThan: "<="}
        for k, op in ops.items():
            if isinstance(c, k):
                return f"({self.p(c.lhs)} {op} {self.p(c.rhs)})"
        raise NotImplementedError(f"condition {c}")

    def _fold(self, fn, args):
        out = self.p(args[0])
        for a in args[1:]:
            out = f"{fn}({out}, {self.p(a)})"
        return out


def _sorted_args(e):
    return sorted(e.args, key=sp.default_sort_key)
