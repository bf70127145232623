"""The DSL's built-in elementwise functions (SymPy functions), the number of arguments each takes, and the
activation names the Python API accepts: one table, read by the name checks of the front end
(:mod:`dmftc.frontend.names`) and by the activations of the derivation (:mod:`dmftc.derive.activation`)."""
from __future__ import annotations

import sympy as sp

__all__ = ["BUILTINS", "ARITY", "SHORTHANDS"]

# the DSL's elementwise functions (two-layer and deep specs, and expressions given to the Python API)
BUILTINS = {
    "tanh": sp.tanh, "erf": sp.erf, "exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt, "abs": sp.Abs,
    "sin": sp.sin, "cos": sp.cos, "relu": lambda x: sp.Max(0, x), "linear": lambda x: x,
    "sigmoid": lambda x: 1 / (1 + sp.exp(-x)), "max": sp.Max, "min": sp.Min,
}
ARITY = {name: 2 if name in ("max", "min") else 1 for name in BUILTINS}      # arguments each function takes
# names the Python API accepts for an activation, as the expressions they stand for
SHORTHANDS = {"tanh": "tanh(h)", "erf": "erf(h)", "linear": "h", "relu": "sqrt(2) * max(0, h)"}
