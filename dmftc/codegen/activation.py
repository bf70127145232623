"""The code of an activation given to the Python API without a spec: ``activation(x, width)`` returning phi and its
four derivatives (:class:`dmftc.derive.activation.Activation`) in jax.numpy, delta functions as Gaussians of
width ``width`` (the printer of :mod:`dmftc.codegen.printer`)."""
from __future__ import annotations

import sympy as sp

from dmftc.codegen.printer import ExprPrinter
from dmftc.derive.activation import X, Activation

__all__ = ["activation_source"]


class _XPrinter(ExprPrinter):
    """The expression printer with the activation's argument printed as ``x``."""

    def atom(self, e):
        return "x" if e == X else None


def activation_source(act: Activation, name: str = "activation") -> str:
    """Python source of ``name(x, width) -> (phi, phi', phi'', phi''', phi'''')`` in jax.numpy."""
    pr = _XPrinter()
    lines = [f"def {name}(x, width):", f'    """phi(x) = {sp.sstr(act.expr)} and four derivatives."""']
    outs = []
    for k, d in enumerate(act.derivatives):
        code = pr(d)
        lines.append(f"    d{k} = {code if d.has(X) else f'jnp.full_like(x, {code})'}")
        outs.append(f"d{k}")
    lines.append(f"    return {', '.join(outs)}")
    return "\n".join(lines) + "\n"
