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
    """Python source of ``name(x, width) -> (phi, phi', phi'', phi''', phi'''')`` in jax.numpy, and of each
    derivative alone, ``name_k(x, width)`` for k = 0..4 (a program that reads one derivative traces that one)."""
    pr = _XPrinter()
    lines = []
    for k, d in enumerate(act.derivatives):
        code = pr(d)
        lines += [f"def {name}_{k}(x, width):", f'    """derivative {k} of phi(x) = {sp.sstr(act.expr)}."""',
                  f"    return {code if d.has(X) else f'jnp.full_like(x, {code})'}", "", ""]
    lines += [f"def {name}(x, width):", f'    """phi(x) = {sp.sstr(act.expr)} and four derivatives."""',
              f"    return {', '.join(f'{name}_{k}(x, width)' for k in range(len(act.derivatives)))}"]
    return "\n".join(lines) + "\n"
