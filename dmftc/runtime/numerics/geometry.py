"""Shapes of order parameters and their place in the flattened propagator; square-root factors of the sources."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Geometry:
    """Shapes of the order parameters and their place in the flattened propagator."""

    mod: object
    sz: dict

    def __post_init__(self):
        m = self.mod
        self.comp_shape = {n: tuple(self.sz[m.AXIS_SIZE[m.AXES[a - 1]]] for a in m.STORED_AXES[n]) for n, _ in m.ORDERS}
        self.offset, off = {}, 0
        for n, _ in m.ORDERS:
            self.offset[n] = off
            off += int(np.prod(self.comp_shape[n], dtype=int))
        self.m = off

    def size(self, name):
        return int(np.prod(self.comp_shape[name], dtype=int))

    def shape(self, name, lead=1, s=1):
        m = self.mod
        axes = m.STORED_AXES[name]
        dims = [self.sz[m.AXIS_SIZE[a]] if (i + 1) in axes else 1 for i, a in enumerate(m.AXES)]
        return (lead, *dims, s)


def source_factors(mod, p, sz) -> list:
    """Square-root factors L (L L^T = covariance) of each source group, PSD-safe (eigendecomposition)."""
    out = []
    for c in mod.source_covariances(p, sz):
        w, v = np.linalg.eigh(np.asarray(c, dtype=float))
        out.append(v * np.sqrt(np.clip(w, 0.0, None)))
    return out
