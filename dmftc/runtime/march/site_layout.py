"""The two-layer program's order parameters in the layout of its march and as one time-major vector: the
ordering every propagator of :mod:`dmftc.runtime.engines.site_engine` is written in (the two-layer engine's,
:mod:`dmftc.reference.two_layer_engine`)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dmftc.runtime.numerics.march_numerics import array_module

__all__ = ["Flat", "canonical"]


def canonical(mod, name, v):
    """A layout array (1, index dims, T) of an order parameter -> (its components in ``mod.STORED_AXES`` order,
    T), as the two-layer engine orders them."""
    axes = tuple(a for a, _ in mod.SITE["axes"])
    stored = dict(mod.SITE["stored"])[name]
    xp = array_module(v)                 # numpy on the host (no eager JAX programs), JAX when traced
    v = xp.asarray(v)[0]
    keep = [axes.index(i) for i in stored]
    v = xp.transpose(v, keep + [k for k in range(len(axes)) if k not in keep] + [len(axes)])
    return v.reshape(-1, v.shape[-1])


class Flat:
    """The order parameters' layout arrays {name: (1, index dims, T)} <-> one time-major vector (T m,) over the
    components of ``mod.ORDERS`` (each in ``mod.STORED_AXES`` order), as the two-layer engine orders them."""

    def __init__(self, mod, shapes: dict, T: int):
        self.mod, self.shapes, self.T = mod, shapes, T
        self.names = [n for n, _ in mod.ORDERS]
        sizes = [int(np.prod(shapes[n][1:-1])) for n in self.names]
        self.m = sum(sizes)
        self.edges = np.cumsum([0] + sizes)
        self.axes = tuple(a for a, _ in mod.SITE["axes"])
        self.stored = dict(mod.SITE["stored"])

    def flat(self, d: dict):
        return jnp.concatenate([canonical(self.mod, n, d[n]) for n in self.names], axis=0).T.reshape(-1)

    def unflat(self, v) -> dict:
        comp = v.reshape(self.T, self.m).T
        return {n: self.layout_rows(n, comp[a:b][None])[0] for n, a, b in zip(self.names, self.edges[:-1],
                                                                               self.edges[1:])}

    def layout_rows(self, name, x):
        """(R, components, X) of ``name`` -> (R, 1, index dims, X) in the layout: the inverse of ``flat``'s
        ordering, with X trailing (the time, or the directions of site_tangents)."""
        axes = self.axes
        keep = [axes.index(i) for i in self.stored[name]]
        perm = keep + [k for k in range(len(axes)) if k not in keep]
        y = x.reshape((x.shape[0],) + tuple(self.shapes[name][1 + k] for k in perm) + (x.shape[-1],))
        return jnp.transpose(y, [0] + [1 + perm.index(k) for k in range(len(axes))] + [len(axes) + 1])[:, None]

    def drivers(self) -> np.ndarray:
        """(T m,) True on the components of the order parameters the fields and running sums read."""
        drive = np.zeros((self.T, self.m), dtype=bool)
        for n, a, b in zip(self.names, self.edges[:-1], self.edges[1:]):
            drive[:, a:b] = n in self.mod.SITE["drivers"]
        return drive.reshape(-1)
