"""Stage 5: print the generated Python module (JAX kernels) from a lowered derivation.

The output is deterministic: it depends only on the spec text, its path and the
dmftc version (no hashes of Python objects, no dict-order accidents, no time
stamps), so recompiling gives byte-identical files.
"""
from __future__ import annotations

import re

import sympy as sp

from dmftc import __version__
from dmftc.frontend import ast
from dmftc.derive.two_layer import Derivation
from dmftc.codegen.lower import Layout
from dmftc.derive.symbolic import ONEHOT

_FUNCS = {sp.tanh: "jnp.tanh", sp.exp: "jnp.exp", sp.log: "jnp.log", sp.sin: "jnp.sin", sp.cos: "jnp.cos",
          sp.Abs: "jnp.abs", sp.erf: "jax.scipy.special.erf", sp.sign: "jnp.sign", sp.cosh: "jnp.cosh",
          sp.sinh: "jnp.sinh"}


_IMPORTS = (("import jax\n", r"\bjax\.(?!numpy\b|scipy\b)"), ("import jax.numpy as jnp\n", r"\bjnp\."),
            ("import jax.scipy.special  # noqa: F401\n", r"\bjax\.scipy\.special\."),
            ("import numpy as np\n", r"(?<![A-Za-z_.])np\."), ("from dmftc.runtime import kernels as _k\n", r"\b_k\."))


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


class Printer(ExprPrinter):
    """SymPy expression -> JAX source text in the uniform-rank layout."""

    dirac_width = "p['dirac width']"

    def __init__(self, layout: Layout, containers: dict[str, str], time_batch: bool = False):
        self.L = layout
        self.containers = containers   # role -> container variable name in the generated function

    def storage(self, name: str) -> str:
        role = self.L.roles.get(name)
        if role is None:
            raise KeyError(f"no storage for {name!r}")
        box = self.containers.get(role)
        if box is None:
            raise KeyError(f"{role} {name!r} is not available here")
        return f"{box}[{name!r}]"

    def atom(self, e):
        if e == ONEHOT:
            return "onehot"
        if isinstance(e, sp.Symbol):
            name = str(e)
            if name in self.L.sizes or name in self.L.axes:
                raise ValueError(f"index {name} used as a value")
            return self.storage(name)
        if isinstance(e, sp.Indexed):
            name = str(e.base.label)
            idx = tuple(str(i) for i in e.indices)
            dst = tuple(self.L.axis(i) for i in idx)
            if self.L.roles.get(name) == "param":
                return f"_k.place({self.storage(name)}, {dst}, RANK)"
            src = tuple(self.L.axis(i) for i in self.L.stored[name])
            ref = self.storage(name)
            return ref if src == dst else f"_k.relabel({ref}, {src}, {dst})"
        if isinstance(e, sp.Sum):
            body = self.p(e.function)
            axes = tuple(self.L.axis(str(lim[0])) for lim in e.limits)
            return f"jnp.sum({body}, axis={axes}, keepdims=True)"
        if isinstance(e, sp.KroneckerDelta):
            a, b = (str(x) for x in e.args)
            return f"_k.kron({self.L.axis(a)}, {self.L.axis(b)}, sz[{self.L.sizes[a]!r}], RANK)"
        return None


def _sorted_args(e):
    return sorted(e.args, key=sp.default_sort_key)


# ------------------------------------------------------------ parameter defaults (numpy)

def default_code(e: ast.Expr) -> str:
    """Numpy source for a parameter default or source covariance expression."""
    if isinstance(e, ast.Num):
        return repr(e.value)
    if isinstance(e, ast.Name):
        return "np.pi" if e.name == "pi" else f"p[{e.name!r}]"
    if isinstance(e, ast.BinOp):
        op = "**" if e.op == "^" else e.op
        return f"({default_code(e.left)} {op} {default_code(e.right)})"
    if isinstance(e, ast.Neg):
        return f"(-{default_code(e.operand)})"
    if isinstance(e, ast.Matrix):
        return "np.array([" + ", ".join(default_code(r) for r in e.rows) + "], dtype=float)"
    if isinstance(e, ast.Call):
        args = ", ".join(default_code(a) for a in e.args)
        if e.name in ("eye", "ones", "zeros"):
            return f"np.{e.name}(int({args}))"
        return f"np.{e.name}({args})"
    raise NotImplementedError(type(e))


HEADER = '''"""Generated by dmftc {version} from {path} -- do not edit.

Model: {model}{desc}
Spec sha256: {sha}

Regenerate with `dmftc compile {path}`.  Layout of every array:
(batch, {axes_doc}s), see dmftc.codegen.lower.
"""
'''


def emit_defaults(w, spec) -> None:
    """The generated ``defaults(p)`` of a spec (two-layer and deep modules alike)."""
    tm = spec.time
    w("\ndef defaults(p):\n    \"\"\"Fill in the spec's default for every parameter not in ``p`` (in declaration order).\"\"\"\n")
    w("    p = dict(p)\n")
    for prm in spec.params:
        w(f"    if {prm.name!r} not in p:\n        p[{prm.name!r}] = {default_code(prm.default)}\n")
    w(f"    if {tm.steps_name!r} not in p:\n        p[{tm.steps_name!r}] = {tm.steps!r}\n")
    w(f"    if {tm.step_name!r} not in p:\n        p[{tm.step_name!r}] = {default_code(tm.step)}\n")
    w("    return p\n\n")


def emit(d: Derivation, L: Layout, *, spec_path: str, spec_sha256: str) -> str:
    spec = d.model.spec
    out: list[str] = []
    w = out.append
    desc = f" ({spec.model.description})" if spec.model.description else ""
    axes_doc = "".join(f"{a}, " for a in L.axes)
    w(HEADER.format(version=__version__, path=spec_path, model=spec.model.name, desc=desc, sha=spec_sha256,
                    axes_doc=axes_doc))
    w("import jax\nimport jax.numpy as jnp\nimport jax.scipy.special  # noqa: F401\nimport numpy as np\n\n"
      "from dmftc.runtime import kernels as _k\n\n")
    w(f"MODEL = {spec.model.name!r}\nDESCRIPTION = {spec.model.description!r}\n")
    w(f"DMFTC_VERSION = {__version__!r}\nSPEC_PATH = {spec_path!r}\nSPEC_SHA256 = {spec_sha256!r}\n")
    w(f"RANK = {L.rank}\nAXES = {L.axes!r}\nAXIS_SIZE = {L.sizes!r}\n")
    params = tuple((p.name, p.dims, p.description) for p in spec.params)
    w(f"PARAMS = {params!r}\n")
    tm = spec.time
    w(f"TIME = {{'var': {tm.var!r}, 'steps': {tm.steps_name!r}, 'step': {tm.step_name!r}}}\n")
    w(f"ORDERS = {d.orders!r}\n")
    w(f"SOURCES = {tuple(g.targets for g in d.sources)!r}\n")
    names = [n for n, _ in d.orders] + [name for g in d.sources for name, _ in g.targets]
    w(f"STORED_AXES = {dict(sorted((k, tuple(L.axis(i) for i in L.stored[k])) for k in names))!r}\n")
    w(f"SINGULAR = {tuple(d.singular)!r}\n")
    if d.kink_fields:
        w(f"# fields at whose zero the activation has a kink (the runtime counts how often paths cross it)\n"
          f"KINK_FIELDS = {d.kink_fields!r}\n")
    w("# None when the process is proven Gaussian (fields affine in the sources): exact moments apply\n")
    w(f"NONLINEAR = {d.nonlinear!r}\n\n")
    # defaults
    emit_defaults(w, spec)
    w("\ndef source_covariances(p, sz):\n    \"\"\"Covariance of each jointly Gaussian source group.\"\"\"\n    return [\n")
    for g in d.sources:
        code = default_code(g.cov)
        if g.targets[0][1]:
            size = L.sizes[g.targets[0][1][0]]
            code = f"_k.covariance({code}, sz[{size!r}])"
        elif len(g.targets) == 1:
            code = f"np.reshape(np.asarray({code}, dtype=float), (1, 1))"
        w(f"        {code},\n")
    w("    ]\n\n")
    pr = Printer(L, {"param": "p", "osum": "Rq"})
    w("\ndef coefficients(p, sz):\n    \"\"\"Coefficient of q_k(t) in its own constraint coeff_k q_k(t) + rest_k(t) = <O_k(t)>.\"\"\"\n"
      "    return {\n")
    for s in d.saddles:
        w(f"        {s.name!r}: {pr(s.coeff)},\n")
    w("    }\n\n")
    missing = d.site_missing
    if d.site is not None:
        from dmftc.codegen.site import emit_site

        part: list[str] = []
        try:
            emit_site(d.site, part.append, scalars=tuple(n for n, _ in d.orders), params=tuple(d.ir.params))
            out.extend(part)
        except NotImplementedError as err:          # the two-layer engine solves it; say why there is no program
            missing = f"its single-site program cannot be printed: {err}"
    if d.site is None or missing is not None:
        w(f"\n\n# no single-site program (dmftc.derive.site_lowering)\nSITE = None\nSITE_MISSING = {missing!r}\n")
    return prune_imports("".join(out))
