"""The deep propagator by reverse-mode sensitivities of the march (research prototype of issue 50).

N Cov of the requested outputs (the time diagonals Delta, K, Phi[l](t, t), G[l](t, t)) as the linear response
of the saddle-point march of the spec's own single-site program, with sources reparameterised through the
kernels' causal Cholesky factors::

    Sigma = W (kappa + H) W^T,     W = d outputs / d eps   (eps: a perturbation added to every average),

kappa the paths' covariance of the observables (response tangents included) and H the paths' mean of the
second derivative of each layer's log-weight in the duals (:mod:`dmftc.reference.march_response`, which
computes all three by brute force for the standard network).  Here nothing of size n x n is formed:

* :mod:`.sweep`: W by one reverse-mode sweep of the march (a vector-Jacobian product per output), and the kappa
  part as the covariance over the paths of V_p = d outputs / d w_p, the derivative in each path's weight
  (V_p = W O_p: every average is a weighted sum over the paths);
* :mod:`.second_order`: W H W^T from per-path quantities, with v_c the source perturbation that output c's
  response duals make (source x[l] at s moved by sum_t W_c(R[l](t, s)) X[l](t), for each response
  R = <dX / dx>) and Gamma the paths' response tangents dX[l](t) / dx'[l](s)::

      (W H W^T)_cd = < D_{v_c} V_d + D_{v_d} V_c + tr(P_c Gamma P_d Gamma) >,

  D_v the derivative along v at fixed order parameters (a forward-mode product of the march with the saddle's
  order parameters held), P_c the response block of W_c as a map from observables X(t) to sources x(s).  The
  first two terms are the observables' responses to the anti-causal couplings the response duals make, the
  trace their loops through -ln det(1 - dF/dx).  (Derived from the log-weight of the march-response form and
  checked against its jax.hessian to round-off: tests/test_adjoint.py.)
* :mod:`.propagator`: groups of paths, means and standard errors.

The derivatives in the source covariances are pathwise (through the Cholesky factors), not Price's theorem as
in :mod:`dmftc.runtime.engines.deep_propagator`: the same propagator in expectation, a different Monte Carlo estimator.
"""
