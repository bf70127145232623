"""Matrix-free deep propagator (research prototype): the Hessian of each layer's Monte Carlo ln Z_l applied to
vectors from per-path JAX derivatives (:mod:`.products`), and the propagator of the requested outputs from those
products alone by a Krylov solve (:mod:`.solve`).  Same estimator, same paths, as
:mod:`dmftc.runtime.engines.deep_propagator` with the Price blocks summed pathwise; see docs/how-it-works.md."""
