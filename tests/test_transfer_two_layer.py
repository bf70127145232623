"""dmftc.reference.transfer_two_layer: dF/dDelta of specs/two_layer.dmft by per-path transfer matrices and
matrix products equals the site engine's tangent march (the Delta columns of 1 - U) on the same paths, to
round-off, with several segments and chunks of paths, at two settings."""
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.reference.transfer_two_layer import delta_jacobian
from dmftc.runtime.engines.site_engine import two_layer_propagator

ROOT = Path(__file__).resolve().parent.parent
T, PATHS = 15, 200          # the sizes of tests/test_site_two_layer.py: the same compiled marches


@pytest.mark.parametrize("gamma, y, kx", [(0.5, 1.0, 0.5), (1.5, -0.8, 0.2)])
def test_transfer_matrices_equal_tangent_march(gamma, y, kx):
    mod = dmftc.load(ROOT / "specs" / "two_layer.dmft").module
    eta = 0.1
    rng = np.random.default_rng(int(10 * gamma))
    uu = rng.multivariate_normal([0.0, 0.0], [[1.0, kx], [kx, 1.0]], size=PATHS)
    rr = rng.normal(size=(PATHS, 1))
    out = two_layer_propagator(mod, [uu, rr], {"gamma": gamma, "y": y, "kx": kx, "eta": eta}, {}, T)
    J = np.eye(4 * T) - out["U"]                        # time-major over (Delta, f_star, K, K_star)
    engine = np.stack([J.reshape(T, 4, T, 4)[:, a, :, 0] for a in range(4)])
    ours = delta_jacobian(uu[:, 0], uu[:, 1], rr[:, 0], out["q"]["Delta"], gamma=gamma, kx=kx, eta=eta,
                          segment=4, chunk=64)          # 4 segments, 4 chunks (the last one short)
    scale = np.abs(engine).max()
    assert scale > 1e-3                                 # a real Jacobian, not zeros on both sides
    assert np.abs(ours - engine).max() <= 1e-12 * scale
    assert np.all(np.triu(ours) == 0.0)                 # causal: Delta(s) moves the fields from s + 1 on
    one = delta_jacobian(uu[:, 0], uu[:, 1], rr[:, 0], out["q"]["Delta"], gamma=gamma, kx=kx, eta=eta,
                         segment=T, chunk=PATHS)        # one segment, one chunk: the same numbers
    assert np.abs(one - ours).max() <= 1e-13 * scale
