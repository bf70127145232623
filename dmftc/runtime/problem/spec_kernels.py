"""The numerics a compiled deep spec determines, in the march's terms (:class:`SpecKernels`), and the layer
numbers of a spec's layer references (:func:`layer_number`)."""
from __future__ import annotations

import hashlib
import re
import weakref
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from dmftc.codegen.deep import ACTIVATION_NAMES
from dmftc.runtime.problem.activation import SiteActivation
from dmftc.errors import ParameterError

__all__ = ["SpecKernels", "layer_number", "module_derivatives", "module_key"]


_MODULE_KEYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def module_key(module) -> tuple:
    """A generated module's identity in the caches of compiled programs: the digest of its source file, so that
    every load of one compiled spec (each ``dmftc.load`` imports the module anew) shares the programs compiled
    for it, and a freed module's reused ``id`` can never select another's.  A module without a source file is
    its own key (held by the cache, so never freed)."""
    try:
        return _MODULE_KEYS[module]
    except KeyError:
        pass
    path = getattr(module, "__file__", None)
    if path and Path(path).is_file():
        key = ("generated", hashlib.sha256(Path(path).read_bytes()).hexdigest())
    else:
        key = ("module", module)
    _MODULE_KEYS[module] = key
    return key


def module_derivatives(module, p: dict, width: float) -> tuple:
    """The five functions h -> phi(h), ..., h -> phi''''(h) of a generated deep module at parameter values ``p``
    and delta width ``width``: its ``phi``, ``dphi``, ... one by one, so that a program reading phi' traces phi'
    alone (the module's ``activation`` returns all five)."""
    return tuple((lambda h, f=getattr(module, name): f(h, p, width)) for name in ACTIVATION_NAMES)


class SpecKernels:
    """The numerics a compiled deep spec determines (its generated module), in the march's terms.

    The march's internal names are the roles: kernels Phi (forward, covariance of u) and G (backward,
    covariance of r), responses Rphi (spec role A) and Rg (role B).  Boundary layers 0 and L+1 are
    constant rows from the spec's boundary values.
    """

    def __init__(self, module):
        self.module = module
        self.key = ("spec", module.SPEC_SHA256, module.SPEC_PATH) + module_key(module)
        r = module.ROLES
        self.names = {"Phi": r["Phi"], "A": r["A"], "G": r["G"], "B": r["B"]}
        self.scalars = tuple(module.SCALARS)

    def site_activation(self, params: dict, width: float):
        """The spec's activation with its four derivatives and its gradient field's coefficients (generated
        functions) at fixed parameter values."""
        mod = self.module
        p = {k: float(v) for k, v in params.items() if np.ndim(v) == 0}     # (arrays: point parameters, which
        # the activation cannot read);  keyed by the parameters the activation and the gradient field read (a sweep of the others reuses
        # every program compiled for them, e.g. the per-path sums of dmftc.runtime.sensitivities.site_moments)
        used = tuple((k, p[k]) for k in mod.ACTIVATION_PARAMS)
        return SiteActivation(key=self.key + (used, float(width)),
                              label=f"{mod.ACTIVATION} of {mod.SPEC_PATH}",
                              fn=lambda h: mod.activation(h, p, float(width)),
                              kink_order=mod.KINK_ORDER, linear=bool(mod.LINEAR), width=float(width),
                              rewidth=lambda w: self.site_activation(params, w),
                              grad=lambda h: mod.gradient(h, p, float(width)),
                              standard_gradient=bool(mod.STANDARD_GRADIENT), program=(mod, p),
                              parts=module_derivatives(mod, p, float(width)))

    def _boundary(self, role, layer, T, p, depth):
        """Row of a boundary family at layer number ``layer`` (0 or depth + 1)."""
        mod, name = self.module, self.names[role]
        for (fam, ref), value in mod.boundaries(p).items():
            if fam == name and layer_number(ref, 0, depth, mod.LAYER, mod.DEPTH) == layer:
                return jnp.full((T,), value, dtype=jnp.float64)
        raise ParameterError(f"no boundary value {name}[{layer}] in {mod.SPEC_PATH}")  # pragma: no cover

    @property
    def linear(self) -> bool:
        return bool(self.module.LINEAR)

    def scalar_values(self, diag, p):
        """The spec's scalar order parameters from the time diagonals ``diag(name, layer)`` of the kernels."""
        return {name: getattr(self.module, f"scalar_{name}")(diag, p) for name in self.scalars}

    def report_f(self, e, p):
        """What the solution reports as 'f': the readout average E_t itself."""
        return e


def layer_number(ref: str, l: int, L: int, var: str, depth: str) -> int:
    """The layer of a reference such as 'l-1', 'L+1', '0' or '' (this layer) seen from layer l of L (``var``:
    the spec's layer variable, ``depth``: its depth parameter)."""
    if not ref:
        return l
    m = re.match(r"^([A-Za-z_][A-Za-z_0-9]*)?([+-]?[0-9]+)?$", ref.replace(" ", ""))
    base = {var: l, depth: L}[m.group(1)] if m.group(1) else 0
    return base + int(m.group(2) or 0)
