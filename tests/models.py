"""Deep-network models used by several tests (imported as ``from models import odd_model``)."""
from dmftc.runtime.deep_model import DeepModel


def odd_model() -> DeepModel:
    """A model that is not the standard network: couplings nonlinear in the kernel and in Delta, a readout
    whose two coefficients differ, boundary kernels other than 1 and a K with other weights and a square."""
    return DeepModel(key=("test-odd",), label="odd", k_h=lambda q, d: 0.3 * d * q + 0.1 * d ** 2 * q ** 2,
                     k_z=lambda q, d: 0.4 * d * q / (1 + 0.2 * q ** 2), readout=(0.6, -0.9, 0.5), phi0=0.7,
                     g_top=1.3, k_of=lambda P, G: sum((1.0 + 0.5 * l) * G[l] * P[l] for l in range(len(P)))
                     + 0.2 * P[-1] ** 2)
