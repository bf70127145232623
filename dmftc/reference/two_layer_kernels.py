"""The former two-layer engine's kernels (fields, observables, running-sum increments, the solved constraints,
the symbolic tangents along each driver and the causal factors of the explicit Jacobian), printed from a spec's
two-layer derivation for the reference engine (:mod:`dmftc.reference.two_layer_engine`) and the tests.

The generated modules in ``generated/`` carry what the solver reads (metadata, defaults, source covariances,
constraint coefficients and the single-site program ``SITE``); the solver marches ``SITE``
(:mod:`dmftc.runtime.engines.site_engine`).  :func:`load` compiles a spec into one module object holding the generated
module's text followed by these kernels (nothing is written to disk), so an oracle reads the same metadata as the
solver and its own, independent kernels.
"""
from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

from dmftc.codegen.lower import Layout, lower
from dmftc.codegen.two_layer import Printer
from dmftc.derive.two_layer import Derivation

__all__ = ["kernel_text", "load", "place_sources", "single_site", "tangent_shape"]

_CACHE: dict = {}


def kernel_text(d: Derivation, L: Layout) -> str:
    """The reference kernels of a two-layer derivation: Python source to append to its generated module."""
    out: list[str] = []
    w = out.append
    orders = dict(d.orders)
    single = tuple(s.name for s in d.saddles if s.observable is not None)
    w("\n\n# ---- reference kernels (dmftc.reference.two_layer_kernels)\n")
    w("import jax  # noqa: E402,F401\nimport jax.numpy as jnp  # noqa: E402\nimport jax.scipy.special  # noqa: E402,F401\n"
      "import numpy as np  # noqa: E402,F401\nfrom dmftc.runtime.numerics import kernels as _k  # noqa: E402\n\n")
    w(f"SINGLE_SITE = {single!r}\nDRIVERS = {d.drivers!r}\n")
    primed_axes = {k: tuple(L.axis(i) for i in v) for k, v in sorted(d.primed.items())}
    w(f"PRIMED_AXES = {primed_axes!r}\n")
    w(f"STORED_AXES = {dict(sorted((k, tuple(L.axis(i) for i in v)) for k, v in L.stored.items()))!r}\n")
    w(f"SAMPLE_SUMS = {tuple(s.name for s in d.sample_sums)!r}\n")
    w(f"ORDER_SUMS = {tuple(s.name for s in d.order_sums)!r}\n")
    past = tuple((pt.row, pt.col, tuple(L.axis(x) for x in orders[pt.row]), tuple(L.axis(x) for x in pt.dummies),
                  tuple(L.axis(x + "'") for x in orders[pt.col])) for pt in d.past_terms)
    w(f"PAST_TERMS = {past!r}\n")
    same = tuple((sd.name, dep) for sd in d.saddles for dep in sd.same_time)
    w(f"SAME_TIME = {same!r}\n\n")
    P = lambda boxes: Printer(L, boxes)
    base = {"param": "p", "source": "S", "field": "F", "sum": "R", "order": "q", "osum": "Rq", "tangent": "T"}
    # fields
    pr = P({k: base[k] for k in ("param", "source", "field", "sum")})
    w("\ndef fields(S, R, p, sz):\n    \"\"\"Fields at the current step from sources and running sums (dependency order).\"\"\"\n")
    w("    F = {}\n")
    for f in d.fields:
        w(f"    F[{f.name!r}] = {pr(f.expr)}  # {f.name}{_idx(f.indices)} = {f.expr}\n")
    w("    return F\n\n")
    pr = P({k: base[k] for k in ("param", "field", "source")})
    w("\ndef observables(F, S, p, sz):\n    \"\"\"Single-site observables O_k whose averages are the order parameters.\"\"\"\n    return {\n")
    for s in d.saddles:
        if s.observable is not None:
            w(f"        {s.name!r}: {pr(s.observable)},\n")
    w("    }\n\n")
    pr = P({k: base[k] for k in ("param", "field", "order")})
    w("\ndef sample_increments(F, q, p, sz):\n    \"\"\"Integrands of the per-sample running sums (sum_{s<t} -> += eta * integrand).\"\"\"\n")
    w("    return {\n")
    for s in d.sample_sums:
        w(f"        {s.name!r}: {pr(s.increment)},\n")
    w("    }\n\n")
    pr = P({k: base[k] for k in ("param", "order")})
    w("\ndef order_increments(q, p, sz):\n    \"\"\"Integrands of the running sums over order parameters.\"\"\"\n    return {\n")
    for s in d.order_sums:
        w(f"        {s.name!r}: {pr(s.increment)},\n")
    w("    }\n\n")
    pr = P({k: base[k] for k in ("param", "osum", "order")})
    w("\ndef rest(q, Rq, p, sz):\n    \"\"\"rest_k(t) of every constraint coeff_k q_k(t) + rest_k(t) = <O_k(t)> (running sums Rq; "
      "same-time\n    order parameters from q).\"\"\"\n    return {\n")
    for s in d.saddles:
        w(f"        {s.name!r}: {pr(s.rest)},\n")
    w("    }\n\n")
    w("\ndef saddle(avg, Rq, p, sz):\n    \"\"\"Solve coeff * q(t) + rest(t) = <O(t)> for every order parameter, in declaration order "
      "(a\n    constraint may read order parameters declared before it at the same time).\"\"\"\n")
    w("    c = coefficients(p, sz)\n    q = {}\n")
    for s in d.saddles:
        lhs = f"avg[{s.name!r}]" if s.observable is not None else "0.0"
        w(f"    q[{s.name!r}] = ({lhs} - {pr(s.rest)}) / c[{s.name!r}]  # {s.coeff}*{s.name}(t) + {s.rest}\n")
    w("    return q\n\n")
    for drv in d.drivers:
        pr = P({k: base[k] for k in ("param", "field", "order", "tangent", "source")})
        w(f"\ndef tangents_{drv}(T, F, q, p, sz, onehot):\n")
        w(f"    \"\"\"Sensitivities to {drv}(s): fields, running-sum increments and observables.\"\"\"\n")
        w("    T = dict(T)\n")
        for t in d.field_tangents:
            if t.driver == drv:
                w(f"    T['d{t.target}/d{drv}'] = {pr(t.expr)}\n")
        w("    inc = {\n")
        for t in d.sum_tangents:
            if t.driver == drv:
                w(f"        'd{t.target}/d{drv}': {pr(t.expr)},\n")
        w("    }\n    obs = {\n")
        for t in d.observable_tangents:
            if t.driver == drv:
                w(f"        {t.target!r}: {pr(t.expr)},\n")
        w("    }\n    return T, inc, obs\n\n")
    pr = P({k: base[k] for k in ("param", "order", "osum")})
    w("\ndef past_factors(q, Rq, p, sz):\n")
    w("    \"\"\"Causal part of dC_row(t)/dq_col(s), s < t: eta * sum_dummies at_t(t) * at_s(s), per PAST_TERMS.\"\"\"\n")
    w("    return [\n")
    for pt in d.past_terms:
        w(f"        ({pr(pt.at_t)}, {pr(pt.at_s)}),  # {pt.row} <- {pt.col}\n")
    w("    ]\n")
    return "".join(out)


def _idx(indices) -> str:
    return f"[{', '.join(indices)}]" if indices else ""


def load(spec_path) -> types.ModuleType:
    """A two-layer spec compiled into one module: its generated module followed by the reference kernels
    (cached per spec text)."""
    from dmftc.codegen import emit
    from dmftc.compiler import display_path, front_end

    path = Path(spec_path)
    key = (str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest())
    if key not in _CACHE:
        text, d = front_end(path)
        if not isinstance(d, Derivation):
            raise TypeError(f"{path} is not a two-layer spec")
        sha = hashlib.sha256(text.encode()).hexdigest()
        src = emit(d, spec_path=display_path(path), spec_sha256=sha) + kernel_text(d, lower(d))
        mod = types.ModuleType(f"dmftc_reference_{d.model.spec.model.name}")
        mod.__file__ = f"<reference kernels of {display_path(path)}>"
        sys.modules[mod.__name__] = mod
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)
        _CACHE[key] = mod
    return _CACHE[key]


def single_site(mod) -> tuple:
    """The order parameters that are single-site averages, in ``ORDERS`` order."""
    return tuple(n for n, _ in mod.ORDERS if n in mod.SINGLE_SITE)


def tangent_shape(mod, geo, name, driver, B, T):
    base = list(geo.shape(name, B, T))
    for a in mod.PRIMED_AXES[driver]:
        base[a] = geo.sz[mod.AXIS_SIZE[mod.AXES[a - 1]]]
    return tuple(base)


def place_sources(mod, x_by_group):
    """Uniform-layout source arrays from per-group values x (leading axis: samples or points)."""
    import jax.numpy as jnp

    from dmftc.runtime.numerics import kernels as _k

    out = {}
    for group, x in zip(mod.SOURCES, x_by_group):
        lead = x.shape[0]
        if len(group) == 1 and group[0][1]:
            name = group[0][0]
            out[name] = _k.place(jnp.asarray(x), (0,) + mod.STORED_AXES[name], mod.RANK)
        else:
            for j, (name, _) in enumerate(group):
                out[name] = jnp.reshape(jnp.asarray(x[:, j]), (lead,) + (1,) * (mod.RANK - 1))
    return out
