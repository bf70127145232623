"""Printers of derived formulas: the spec's own notation for ``dmftc derive`` and LaTeX for ``--latex``.

:func:`dsl_str` prints a SymPy expression the way a spec writes it: ``sum(s < t: x)``, ``sum(nu: x)``,
``sum(l = 0..L: G[l+1] Phi[l])``, ``x^2``, ``max(0, h)``.  :func:`tex` prints it with SymPy's LaTeX printer and
names typeset from the spec's: ``h_star`` as h with subscript star, ``Phi[l-1]`` as Phi with subscript l-1,
``phi'`` with a prime, the sensitivity ``dh/dDelta'`` as a partial derivative.  Dummy indices of index sums
(``nu#3``) are renamed to a free name first (:func:`clean_dummies`), and the step number and per-step parameters
(``lr[T]``) are shown at the current step t (:func:`dmftc.ir.symbolic.show_time`).  :func:`from_ast` converts an expression
of the spec's syntax tree for display.
"""
from __future__ import annotations

import re

import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.printing.conventions import split_super_sub
from sympy.printing.latex import LatexPrinter, translate
from sympy.printing.str import StrPrinter

from dmftc.ir.symbolic import show_time
from dmftc.frontend import ast

_DUMMY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)#\d+")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Avg(sp.Function):
    """<x>: a single-site average (display only)."""

    nargs = 1

    def _sympystr(self, p):
        return f"<{p._print(self.args[0])}>"

    def _latex(self, p):
        return rf"\left\langle {p._print(self.args[0])} \right\rangle"


class Partial(sp.Function):
    """d x / d y of two quantities (display only: a pathwise derivative or a sensitivity)."""

    nargs = 2

    def _sympystr(self, p):
        return f"d {p._print(self.args[0])} / d {p._print(self.args[1])}"

    def _latex(self, p):
        return rf"\frac{{\partial {p._print(self.args[0])}}}{{\partial {p._print(self.args[1])}}}"


class IndexSum(sp.Function):
    """sum(nu: x) over an index's whole range (display only): IndexSum(x, nu)."""

    def _sympystr(self, p):
        return f"sum({', '.join(p._print(i) for i in self.args[1:])}: {p._print(self.args[0])})"

    def _latex(self, p):
        return rf"\sum_{{{','.join(p._print(i) for i in self.args[1:])}}} {p.parenthesize(self.args[0], 50)}"


def _names(expr) -> list[str]:
    out = [str(a) for a in expr.atoms(sp.Symbol)]
    out += [str(f.func) for f in expr.atoms(AppliedUndef)]
    out += [str(a.base.label) for a in expr.atoms(sp.Indexed)]
    return out


def clean_dummies(expr):
    """Rename the dummies ``nu#3`` of index sums to ``nu`` (or ``nu2``, ``nu3``, ... if ``nu`` is taken)."""
    names = _names(expr)
    dummies = sorted({m.group(0) for n in names for m in _DUMMY.finditer(n)})
    if not dummies:
        return expr
    taken = {t for n in names for t in _TOKEN.findall(_DUMMY.sub("", n))}
    new = {}
    for d in dummies:
        base, k = d.split("#")[0], 1
        cand = base
        while cand in taken:
            k += 1
            cand = f"{base}{k}"
        taken.add(cand)
        new[d] = cand
    rename = lambda n: _DUMMY.sub(lambda m: new[m.group(0)], n)  # noqa: E731
    rep = {a: sp.Symbol(rename(a.name), **a.assumptions0) for a in expr.atoms(sp.Symbol) if "#" in a.name}
    expr = expr.xreplace(rep)
    funcs = {f: sp.Function(rename(str(f.func)))(*f.args) for f in expr.atoms(AppliedUndef) if "#" in str(f.func)}
    return expr.xreplace(funcs)


def _user_function(expr) -> bool:
    """A function named in a spec (an undefined SymPy function, or an activation phi, phi', ... of dmftc)."""
    return isinstance(expr, AppliedUndef) or not type(expr).__module__.startswith("sympy")


def _upper_names(e) -> bool:
    """Limits given by sizes (P, L): an index or layer sum, not a sum over time."""
    return bool(e.free_symbols) and all(str(x)[:1].isupper() for x in e.free_symbols)


class _LayerMixin:
    """Functions of a layer-sum variable print with brackets: ``G(l + 1)`` inside ``sum(l = 0..L: ...)`` is G[l+1]."""

    def _layer_sum_vars(self, expr):
        return {lim[0] for lim in expr.limits if _upper_names(sp.sympify(lim[2]))}

    def _is_layer_function(self, expr) -> bool:
        bound = getattr(self, "_layer_bound", set())
        return _user_function(expr) and len(expr.args) == 1 and bool(expr.args[0].free_symbols & bound)

    def _enter(self, expr):
        old = set(getattr(self, "_layer_bound", set()))
        self._layer_bound = old | self._layer_sum_vars(expr)
        return old


class DslPrinter(_LayerMixin, StrPrinter):
    """SymPy's string printer with the spec's notation for sums, powers and layer-indexed functions."""

    def _print_Sum(self, expr):
        old = self._enter(expr)
        try:
            text = self._print(expr.function)
        finally:
            self._layer_bound = old
        for var, lo, hi in reversed(expr.limits):
            v, lo, hi = self._print(var), sp.sympify(lo), sp.sympify(hi)
            if lo == 0 and _upper_names(hi) and var.is_integer and len(hi.free_symbols) == 1 \
                    and sp.simplify(hi + 1 - next(iter(hi.free_symbols))) == 0:
                head = v                                                  # sum(nu: x) over 1..P
            elif lo == 0 and not _upper_names(hi) and (hi + 1).is_Symbol:
                head = f"{v} < {self._print(hi + 1)}"
            elif lo == 0 and not _upper_names(hi) and hi.is_Symbol:
                head = f"{v} <= {self._print(hi)}"
            else:
                head = f"{v} = {self._compact(lo)}..{self._compact(hi)}"
            text = f"sum({head}: {text})"
        return text

    def _compact(self, e):
        return self._print(e).replace(" ", "")

    def _print_Function(self, expr):
        if self._is_layer_function(expr):
            return f"{expr.func}[{self._compact(expr.args[0])}]"
        return super()._print_Function(expr)

    def _print_Pow(self, expr, rational=False):
        return super()._print_Pow(expr, rational).replace("**", "^")

    def _print_KroneckerDelta(self, expr):
        return f"delta({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_Max(self, expr):
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr):
        return f"min({', '.join(self._print(a) for a in expr.args)})"


def dsl_str(expr) -> str:
    """``expr`` in the spec's notation (one line)."""
    if isinstance(expr, str):
        return expr
    return DslPrinter().doprint(clean_dummies(show_time(sp.sympify(expr))))


# ------------------------------------------------------------------------------------------------- LaTeX


def _tex_word(word: str) -> str:
    if word == "star":
        return r"\star"
    t = translate(word)
    return t if t.startswith("\\") or len(word) == 1 or word.isdigit() else rf"\mathrm{{{word}}}"


def _tex_base(name: str) -> str:
    primes = len(name) - len(name.rstrip("'"))
    name = name.rstrip("'").lstrip("_")
    head, sup, sub = split_super_sub(name) if name else ("", [], [])
    out = translate(head) if len(head) > 1 else head
    if len(head) > 1 and not out.startswith("\\"):
        out = rf"\mathrm{{{head}}}" if head.isalpha() else head
    if sub:
        out += "_{" + ",".join(_tex_word(s) for s in sub) + "}"
    if sup:
        out += "^{" + ",".join(_tex_word(s) for s in sup) + "}"
    return out + "'" * primes


def _tex_indices(items: list[str]) -> str:
    def one(i):
        i = i.strip()
        m = re.fullmatch(r"([A-Za-z]+)(\d*)('*)", i)
        if m:
            return (translate(m.group(1)) if len(m.group(1)) > 1 else m.group(1)) + \
                (f"_{{{m.group(2)}}}" if m.group(2) else "") + m.group(3)
        return re.sub(r"([A-Za-z]{2,})", lambda w: translate(w.group(1)), i)
    return ",".join(one(i) for i in items)


def _tangent(name: str):
    """(target, driver) in LaTeX of a sensitivity's name ``dX/dY'[i, j']`` (primed indices are the driver's)."""
    m = re.fullmatch(r"d(?P<x>[^/]+)/d(?P<y>[^'\[]+)'(?:\[(?P<ix>.*)\])?", name)
    if not m:
        return None
    ix = [i.strip() for i in m.group("ix").split(",")] if m.group("ix") else []
    tx = [i for i in ix if not i.endswith("'")]
    ty = [i for i in ix if i.endswith("'")]
    return (tex_name(m.group("x") + (f"[{','.join(tx)}]" if tx else "")),
            tex_name(m.group("y") + (f"[{','.join(ty)}]" if ty else "")))


def tex_name(name: str) -> str:
    """The LaTeX of a quantity's name: ``h_star``, ``Phi[l-1]``, ``phi'``, ``I1``, ``dh/dDelta'[mu,mu']``."""
    if name.startswith("["):                                     # an indicator such as [s<t] or [t=s']
        return r"\left[" + name[1:-1].replace("<=", r"\le ") + r"\right]"
    tangent = _tangent(name)
    if tangent:
        return rf"\frac{{\partial {tangent[0]}}}{{\partial {tangent[1]}(s')}}"
    m = re.fullmatch(r"(?P<base>[^\[]+)\[(?P<ix>.*)\]('*)", name)
    if m:
        base = _tex_base(m.group("base"))
        ix = _tex_indices(m.group("ix").split(","))
        if "_{" in base:
            return "{" + base + "}_{" + ix + "}" + m.group(3)
        return f"{base}_{{{ix}}}{m.group(3)}"
    return _tex_base(name)


class TexPrinter(_LayerMixin, LatexPrinter):
    """SymPy's LaTeX printer with the spec's names typeset (:func:`tex_name`) and f(t) for applied functions."""

    def _print_Symbol(self, expr, style="plain"):
        return tex_name(expr.name)

    def _print_Sum(self, expr):
        old = self._enter(expr)
        limits = []
        for var, lo, hi in expr.limits:                  # an index sum over 0..P-1 is the spec's 1..P
            size = hi + 1
            if lo == 0 and var.is_integer and size.is_Symbol and _upper_names(size):
                lo, hi = 1, size
            limits.append((var, lo, hi))
        try:
            return super()._print_Sum(sp.Sum(expr.function, *limits))
        finally:
            self._layer_bound = old

    def _print_Function(self, expr, exp=None):
        if not _user_function(expr):
            return super()._print_Function(expr, exp)
        name = str(expr.func)
        tangent = _tangent(name)
        if tangent:                                      # dh/dDelta'(t): d h(t) / d Delta(s')
            args = ", ".join(self._print(a) for a in expr.args)
            out = rf"\frac{{\partial {tangent[0]}\left({args}\right)}}{{\partial {tangent[1]}\left(s'\right)}}"
            return rf"\left({out}\right)^{{{exp}}}" if exp is not None else out
        if self._is_layer_function(expr):
            out = "{" + tex_name(f"{name}[{self._print(expr.args[0]).replace(' ', '')}]") + "}"
        else:
            args = ", ".join(self._print(a) for a in expr.args)
            out = "{" + tex_name(name) + r"\left(" + args + r"\right)}"
        return f"{out}^{{{exp}}}" if exp is not None else out


def tex(expr) -> str:
    """LaTeX of ``expr`` by SymPy's printer with the spec's names."""
    return TexPrinter({"mul_symbol": r"\,"}).doprint(clean_dummies(show_time(sp.sympify(expr))))   # thin space: kx g(t)


def tex_text(text: str) -> str:
    """Plain text for ``\\text{...}`` with LaTeX's special characters escaped."""
    special = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "_": r"\_", "^": r"\^{}", "&": r"\&",
               "%": r"\%", "$": r"\$", "#": r"\#", "~": r"\~{}"}
    return "".join(special.get(c, c) for c in text)


# ------------------------------------------------------------------------------- spec syntax -> SymPy

def from_ast(e: ast.Expr, step=sp.Symbol("eta")):
    """An expression of the spec's syntax tree as SymPy, for display (names kept as written)."""
    f = lambda x: from_ast(x, step)  # noqa: E731
    if isinstance(e, ast.Num):
        return sp.nsimplify(e.value) if float(e.value).is_integer() else sp.Float(e.value)
    if isinstance(e, ast.Name):
        return sp.Symbol(e.name)
    if isinstance(e, ast.BinOp):
        a, b = f(e.left), f(e.right)
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
                "^": lambda: a ** b}[e.op]()
    if isinstance(e, ast.Neg):
        return -f(e.operand)
    if isinstance(e, ast.Matrix):
        rows = [f(r) for r in e.rows]
        return sp.Matrix(rows) if all(isinstance(r, sp.MatrixBase) for r in rows) else sp.Matrix([rows])
    if isinstance(e, ast.Call):
        idx = f"[{','.join(e.indices)}]" if e.indices else ""
        return sp.Function(f"{e.name}{idx}")(*[f(a) for a in e.args])
    if isinstance(e, ast.PrimeCall):
        return sp.Function(f"{e.name}'")(*[f(a) for a in e.args])
    if isinstance(e, ast.Indexed):
        return sp.Symbol(f"{e.name}[{','.join(e.indices)}]")
    if isinstance(e, ast.Hat):
        idx = f"[{','.join(e.indices)}]" if e.indices else ""
        return sp.Function(f"hat{e.name}{idx}")(*[sp.Symbol(x) for x in (e.time, e.time2) if x])
    if isinstance(e, ast.Expectation):
        return Avg(f(e.body))
    if isinstance(e, ast.Response):
        return Avg(Partial(f(e.of), f(e.wrt)))
    if isinstance(e, ast.LayerSum):
        return sp.Sum(f(e.body), (sp.Symbol(e.var), sp.sympify(str(e.lo)), sp.sympify(str(e.hi))))
    if isinstance(e, (ast.TimeSum, ast.Integral)) and getattr(e, "cmp", None):
        v, up = sp.Symbol(e.var), sp.Symbol(e.upper)
        body = sp.Sum(f(e.body), (v, 0, up - 1 if e.cmp == "<" else up))
        return step * body if isinstance(e, ast.Integral) else body
    if isinstance(e, ast.IndexSum):
        return IndexSum(f(e.body), *[sp.Symbol(i, integer=True) for i in e.indices])
    raise TypeError(f"cannot display {type(e).__name__}")
