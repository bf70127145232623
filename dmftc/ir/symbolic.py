"""SymPy vocabulary shared by the derivation and lowering stages.

Quantities at the *current* time step are plain SymPy symbols (scalars) or
``Indexed`` objects (``h[mu]``); index sums are ``Sum(body, (mu, 0, P - 1))``.
Time disappears in this representation: causal integrals become running-sum
symbols whose increments are expressions at the current step.
"""
from __future__ import annotations

import sympy as sp

# role of every IndexedBase/Symbol name created here: "param", "order", "hat",
# "source", "field", "sum", "tangent", "onehot", "index", "size"
ONEHOT = sp.Symbol("onehot[s=t]")
ETA_NAME = "eta"
# time as a value: the number of the step at which an expression is evaluated (0, 1, ..., T - 1)
STEP = sp.Symbol("__step", real=True)
PER_STEP = "__per_step_"       # a per-step parameter lr[T] read k steps from the current one: __per_step_lr(k)


def per_step(name: str, offset: int) -> sp.Expr:
    """The per-step parameter ``name`` at the current step plus ``offset`` (lr[t - 1]: offset -1)."""
    return sp.Function(PER_STEP + name, real=True)(sp.Integer(offset))


def show_time(expr, when: str = "t"):
    """For display: the step number and the per-step parameters at the step ``when`` (``__step`` -> t,
    ``__per_step_lr(-1)`` -> the symbol ``lr[t - 1]``)."""
    if not isinstance(expr, sp.Basic):
        return expr
    now = sp.Symbol(when)
    rep = {f: sp.Symbol(f"{str(f.func)[len(PER_STEP):]}[{now + f.args[0]}]")
           for f in expr.atoms(sp.Function) if str(f.func).startswith(PER_STEP) and len(f.args) == 1}
    if STEP in expr.free_symbols:
        rep[STEP] = now
    return expr.xreplace(rep) if rep else expr


def step_cancelled(expr, step: str):
    """``step * expr`` with the step (named ``step``, e.g. eta) cancelled term by term where ``expr`` divides by it
    (the increment of a recurrence's running sum is its change over eta), for display; None if no term does."""
    if not isinstance(expr, sp.Basic):
        return None
    eta = [a for a in expr.free_symbols if a.name == step]
    if not eta or not any(eta[0] in sp.denom(x).free_symbols for x in sp.Add.make_args(expr)):
        return None
    return sp.Add(*[eta[0] * x for x in sp.Add.make_args(expr)])


def index_symbol(name: str) -> sp.Symbol:
    return sp.Symbol(name, integer=True)


def quantity(name: str, indices=()) -> sp.Expr:
    """The current value of a (possibly indexed) quantity."""
    if not indices:
        return sp.Symbol(name, real=True)
    return sp.IndexedBase(name)[tuple(index_symbol(i) if isinstance(i, str) else i for i in indices)]


def base_name(expr) -> str:
    return str(expr.base.label) if isinstance(expr, sp.Indexed) else str(expr)


def free_indices(expr, index_names) -> set[str]:
    """Index symbols that are not bound by a Sum."""
    if isinstance(expr, sp.Indexed):
        out = set()
        for i in expr.indices:
            out |= {str(s) for s in i.free_symbols if str(s) in index_names}
        return out
    if isinstance(expr, sp.Sum):
        bound = {str(lim[0]) for lim in expr.limits}
        return free_indices(expr.function, index_names) - bound
    if isinstance(expr, sp.KroneckerDelta):
        return {str(s) for s in expr.free_symbols if str(s) in index_names}
    out = set()
    for a in expr.args:
        out |= free_indices(a, index_names)
    return out


def _contract_term(term, var):
    """Remove ``var`` from a product containing KroneckerDelta(var, x); None if impossible."""
    factors = sp.Mul.make_args(term)
    for f in factors:
        if isinstance(f, sp.KroneckerDelta) and var in f.args:
            other = f.args[1] if f.args[0] == var else f.args[0]
            if other == var:
                continue
            rest = sp.Mul(*[g for g in factors if g is not f])
            return rest.xreplace({var: other})
    return None


def contract(expr):
    """Eliminate sums over KroneckerDelta factors: sum_k d(k, mu) f(k) -> f(mu)."""
    if isinstance(expr, sp.Sum):
        body = contract(expr.function)
        limits = list(expr.limits)
        # handle the innermost limit first, recursively for the rest
        var, lo, hi = limits[-1]
        outer = limits[:-1]
        kept, done = [], []
        for term in sp.Add.make_args(sp.expand(body)):
            c = _contract_term(term, var)
            if c is None:
                if term.has(var):
                    kept.append(term)
                else:
                    done.append(term * (hi - lo + 1))
            else:
                done.append(c)
        if kept and outer and not done:     # SymPy would flatten Sum(Sum(x, var), outer) back into this sum
            return sp.Sum(contract(sp.Sum(sp.Add(*kept), *outer)), (var, lo, hi))
        inner = sp.Add(*done) + (sp.Sum(sp.Add(*kept), (var, lo, hi)) if kept else 0)
        if outer:
            return contract(sp.Sum(inner, *outer)) if inner != 0 else sp.Integer(0)
        return inner
    if not expr.args or isinstance(expr, (sp.Indexed, sp.Symbol)):
        return expr
    return expr.func(*[contract(a) for a in expr.args])


def finish_derivative(d):
    """Evaluate what SymPy leaves of a derivative because indexed quantities are not known to be real:
    re(x) -> x, im(x) -> 0, d sign(x)/dy -> 2 delta(x) dx/dy (as it does for real symbols)."""
    if not d.has(sp.Derivative, sp.re, sp.im):
        return d
    d = d.replace(lambda x: isinstance(x, (sp.re, sp.im)) and isinstance(x.args[0], sp.Indexed),
                  lambda x: x.args[0] if isinstance(x, sp.re) else sp.Integer(0))
    d = d.replace(lambda x: isinstance(x, sp.Derivative) and isinstance(x.expr, sp.sign) and len(x.variables) == 1,
                  lambda x: 2 * sp.DiracDelta(x.expr.args[0]) * sp.diff(x.expr.args[0], x.variables[0]))
    return d.replace(lambda x: isinstance(x, sp.Derivative), lambda x: x.doit())


def unsupported(expr):
    """The first part of ``expr`` that generated code cannot evaluate (an unevaluated derivative, the
    derivative of a delta function, a complex or non-finite constant), or None."""
    for a in sp.preorder_traversal(expr):
        if isinstance(a, (sp.Derivative, sp.Subs, sp.re, sp.im)) or a in (sp.I, sp.nan, sp.zoo, sp.oo, -sp.oo):
            return a
        if (isinstance(a, sp.DiracDelta) and len(a.args) > 1) or (a.is_NumberSymbol and a not in (sp.pi, sp.E)):
            return a
    return None


def diff_indexed(expr, target, fresh_indices):
    """d expr / d target[fresh] with Kronecker deltas contracted."""
    if isinstance(target, sp.Indexed):
        var = target.base[tuple(fresh_indices)]
    else:
        var = target
    return contract(finish_derivative(sp.diff(expr, var)))


def chain(expr, dependencies, tangent_of, fresh_for, size_of):
    """Sum over dependencies q of d expr/d q[k] * tangent_of(q)[k].

    ``dependencies`` maps a base name to its declared index names; ``tangent_of``
    returns the tangent quantity for given index symbols; ``fresh_for`` yields
    fresh dummy index names for declared ones; ``size_of`` gives an index's size symbol.
    """
    total = sp.Integer(0)
    for name, idx in dependencies.items():
        if not idx:
            sym = sp.Symbol(name, real=True)
            if expr.has(sym):
                total += finish_derivative(sp.diff(expr, sym)) * tangent_of(name, ())
            continue
        base = sp.IndexedBase(name)
        if not expr.has(base):
            continue
        dummies = [index_symbol(d) for d in fresh_for(idx)]
        d = finish_derivative(sp.diff(expr, base[tuple(dummies)]))
        term = d * tangent_of(name, tuple(dummies))
        limits = [(k, 0, size_of(str(k)) - 1) for k in dummies]
        total += contract(sp.Sum(term, *limits))
    return total


def singular_terms(expr) -> list:
    """DiracDelta factors (from derivatives of non-smooth activations)."""
    return sorted({str(a) for a in expr.atoms(sp.DiracDelta)})
