"""Ground truth from the library people train with: finite-width networks trained by optax itself.

The network (width N, L >= 1 hidden layers, mean-field parameterisation, all weights N(0, 1) iid at t = 0)::

    h^1_mu = W^0 x_mu / sqrt(D),     h^{l+1}_mu = W^l phi(h^l_mu) / sqrt(N)      (l = 1..L-1)
    f_mu,c = w_c . phi(h^L_mu) / (gamma N),     ftilde(t) = f(t) - f(0)           (background subtracted)

with W^0 (N, D), W^l (N, N), readouts w (N, C).  The loss is summed over the P training points: the squared
loss 1/2 sum_mu |y_mu - ftilde_mu|^2 (error signal Delta = y - ftilde; scalar outputs when y is (P,)), or the
softmax cross-entropy -sum_mu sum_c y_mu,c log softmax(ftilde_mu)_c on one-hot y (P, C) (Delta_mu,c = y_mu,c -
softmax(ftilde_mu)_c).  Every parameter is trained by an optax GradientTransformation applied to jax.grad of
this loss; by default the optimiser of the issue (:func:`sgd`)::

    optax.chain(optax.add_decayed_weights(lam / (N gamma^2)),
                optax.sgd(learning_rate=lambda t: eta N gamma^2 lr[t], momentum=beta))

(optax's heavy ball: v <- beta v + g, theta <- theta - eta N gamma^2 lr[t] v, t counting updates from 0).
With beta = lam = 0 and lr = 1 this is the plain gradient descent of :mod:`dmftc.validation.ensemble` and
:mod:`dmftc.validation.deep_ensemble` (same loss normalisation, same random draws: the same networks, equal to
round-off; tested).  Records at t = 0..T-1, each taken *before* the t-th update:

    Delta, f = ftilde                  (P,) or (P, C)
    K   = N gamma^2 grad f_mu,c . grad f_nu,c'    the NTK of the points, (P, P) or (P, C, P, C)
    Phi[l] = phi(h^l_mu) . phi(h^l_nu) / N        (P, P),  l = 1..L
    G[l]   = g^l_mu,c . g^l_nu,c' / N             (P, P) or (P, C, P, C),  g^l = gamma N df/dh^l

(the time diagonals of the two-time kernels of :func:`dmftc.validation.deep_ensemble.simulate_deep`).  On one
point (``Kx`` None, |x|^2 / D = ``input_norm``) the point axes are dropped, as there.

Randomness: member m uses the m-th block of N (D + C) + (L - 1) N^2 standard normals of
np.random.default_rng(seed) (neuron i's D input weights then its C readouts, then W^1..W^{L-1} row-major: for
C = 1 the layout of :func:`dmftc.validation.deep_ensemble.draw_deep_parameters`).  Members are trained in
chunks by one jit-compiled, jax.vmap-ed program (``lax.scan`` over the steps); the last chunk is padded with
copies and the copies dropped, so results do not depend on the chunk size.
"""
from dmftc.validation.optax_nets.inputs import LOSSES, sgd
from dmftc.validation.optax_nets.train import (OptaxEnsembleStats, optax_names, optax_truth, richardson,
                                               simulate_optax)

__all__ = ["LOSSES", "OptaxEnsembleStats", "sgd", "simulate_optax", "optax_truth", "richardson", "optax_names"]
