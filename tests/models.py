"""Deep-network models and two-layer source draws used by several tests (imported as ``from models import
odd_model``)."""
import numpy as np

from dmftc.runtime.problem.deep_model import DeepModel


def odd_model() -> DeepModel:
    """A model that is not the standard network: couplings nonlinear in the kernel and in Delta, a readout
    whose two coefficients differ, boundary kernels other than 1 and a K with other weights and a square."""
    return DeepModel(key=("test-odd",), label="odd", k_h=lambda q, d: 0.3 * d * q + 0.1 * d ** 2 * q ** 2,
                     k_z=lambda q, d: 0.4 * d * q / (1 + 0.2 * q ** 2), readout=(0.6, -0.9, 0.5), phi0=0.7,
                     g_top=1.3, k_of=lambda P, G: sum((1.0 + 0.5 * l) * G[l] * P[l] for l in range(len(P)))
                     + 0.2 * P[-1] ** 2, march=structured)


def structured(activation, model):
    """The march of a hand-built model: the reference structured march of its kernels (DeepModel.march)."""
    from dmftc.reference.structured_march import ModelKernels

    return ModelKernels(activation, model)


def assert_site_moments_equal_autodiff(activation, model, *, L=3, T=3, S=64, seed=5):
    """Every per-path sum of dmftc.runtime.sensitivities.site_moments equals the autodiff structured estimator
    (dmftc.reference.deep_autodiff) on the same paths of the saddle of ``model`` with ``activation``, for every
    layer kind of depth L (r-block varying, both blocks, u-block varying), to 1e-12 of each sum's size; every
    sum is exercised (size > 1e-3)."""
    import jax.numpy as jnp
    import numpy as np

    from dmftc.runtime.problem.deep_action import Layout, gather_local, saddle_point_vector
    from dmftc.runtime.engines.deep_propagator import mc_saddle
    from dmftc.reference.deep_autodiff import autodiff_estimator
    from dmftc.runtime.sensitivities.local_estimator import estimator

    xi = np.random.default_rng(seed).standard_normal((2, L, S, T))
    sad, fields = mc_saddle(activation=activation, L=L, T=T, xiu=xi[0], xir=xi[1], model=model)
    lay = Layout(L, T)
    x0 = saddle_point_vector(sad)
    names = ("F", "residual", "g", "f", "ff", "Jf", "Ha", "Pc", "Pe")
    for l in range(1, L + 1):
        v, _ = gather_local(jnp.asarray(x0), lay, l, phi0=model.phi0, g_top=model.g_top)
        fast, ref = (est.moments(np.asarray(v), fields.w[l - 1], fields.x[l - 1], top=float(l == L), model=model)
                     for est in (estimator(T, activation, l > 1, l < L),
                                 autodiff_estimator(T, activation, l > 1, l < L, method="struct")))
        assert fast[1] < 1e-24 * S                       # the march's fields solve the single-site equations
        for name, a, b in zip(names, fast, ref):
            if name == "residual":
                continue
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape, (l, name)
            scale = np.abs(b).max()
            assert scale > 1e-3, (l, name)            # every block is exercised
            assert np.abs(a - b).max() <= 1e-12 * scale, (l, name, np.abs(a - b).max(), scale)


def source_draws(mod, p, sz, S: int, seed: int) -> list:
    """S draws of each of a two-layer module's sources (``mod.source_covariances``), pseudo-random with ``seed``."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((S, np.shape(c)[0])) @ np.linalg.cholesky(np.asarray(c, float)).T
            for c in mod.source_covariances(p, sz)]
