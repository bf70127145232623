"""dmftc.runtime.sensitivities.site_transfer: the drivers' columns of dF/dq by per-path transfer matrices equal the tangent march
(dmftc.runtime.sensitivities.site_tangents) on the same paths to round-off, for every shipped two-layer spec, in batches of
paths and causal segments, also where its transfer matrices are singular; the programs it does not apply to keep
the march."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import dmftc
from dmftc.errors import ParameterError
from dmftc.runtime.problem.params import resolve_params
from dmftc.runtime.sensitivities.site_drivers import tangent_method
from dmftc.runtime.engines.site_engine import group_saddle, group_sensitivities, normals_of
from dmftc.runtime.sensitivities.site_transfer import transfer_applies
from models import source_draws

ROOT = Path(__file__).resolve().parent.parent
T, PATHS = 15, 200
TWO_LAYER = ["two_layer", "two_layer_multi", "two_layer_sgd", "two_layer_softmax", "rates", "eos", "online_linear",
             "linear_whitened"]


def _compare(mod, params=None):
    """The group's dF/dq by the tangent march in one piece and by transfer matrices in batches and segments."""
    p, sz, _ = resolve_params(mod, {"T": T, **(params or {})}, dirac_width=0.1)
    normals = normals_of(mod, source_draws(mod, p, sz, PATHS, 3))
    pj = {k: jnp.asarray(v, jnp.float64) for k, v in p.items()}
    width = float(p["dirac width"])
    wts = jnp.full(PATHS, 1.0 / PATHS)
    q = group_saddle(mod, normals, wts, pj, sz, T, width)
    march = group_sensitivities(mod, normals, wts, pj, q, sz, T, width, segments=1, tangents="march")[0]
    # 4 batches of 50 paths (the constraints' explicit terms in the first only) and 4 segments of 4 steps
    ours = group_sensitivities(mod, normals, wts, pj, q, sz, T, width, batch=50, segments=4, tangents="transfer")[0]
    m = march.shape[0] // T
    below = np.tril(np.ones((T, T)), -1).astype(bool)
    across = np.abs(march.reshape(T, m, T, m).transpose(0, 2, 1, 3)[below]).max()
    assert across > 1e-3 * np.abs(march).max()              # couplings across time, not only the diagonal blocks
    scale = np.abs(march).max()
    assert np.abs(ours - march).max() <= 1e-12 * scale, np.abs(ours - march).max() / scale
    return march


@pytest.mark.parametrize("name", TWO_LAYER)
def test_transfer_matrices_equal_the_tangent_march(name):
    mod = dmftc.load(ROOT / "specs" / f"{name}.dmft").module
    assert transfer_applies(mod) and tangent_method(mod) == "transfer"      # the default for the shipped specs
    _compare(mod)


@pytest.mark.parametrize("params", [dict(beta=0.0), dict(beta=0.0, lam=0.3, lr=np.linspace(1.0, 0.2, T))])
def test_singular_transfer_matrices(params):
    """Plain gradient descent in recurrence form (beta = 0): a velocity's running sum is replaced at every step,
    so the per-path transfer matrices M_t are singular: the transfer form inverts none of them."""
    _compare(dmftc.load(ROOT / "specs" / "two_layer_sgd.dmft").module, params)


def test_programs_with_order_scope_sums_keep_the_march():
    mod = dmftc.load(ROOT / "tests" / "specs" / "two_layer_ntk.dmft").module      # a running sum of q (NTK)
    assert not transfer_applies(mod) and tangent_method(mod) == "march"
    with pytest.raises(ParameterError, match="tangents='march'"):
        tangent_method(mod, "transfer")
    with pytest.raises(ParameterError, match="'transfer' or 'march'"):
        tangent_method(mod, "adjoint")
