"""Ground truth: ensembles of finite-width networks trained by gradient descent, mapped onto the specs'
order parameters (as labelled Datasets: :func:`truth_dataset`)."""
from dmftc.validation.datasets import truth_dataset  # noqa: E402
from dmftc.validation.optax_nets import optax_truth, simulate_optax  # noqa: E402

__all__ = ["truth_dataset", "simulate_optax", "optax_truth"]
