"""Fixed copies of shipped specs for tests, so edits of specs/ do not change them, and edits of shipped specs that
several tests share."""

EOS = """\
model eos "two-layer linear net, one point, large-step gradient descent"
param gamma = 3.0 "feature learning strength"
param y = 1.0 "training target"
time t: T = 40 steps of eta = 0.5
order Delta(t), K(t)
process:
  u ~ normal(0, 1);  r ~ normal(0, 1)
  h(t) = u + gamma * integral(Delta(s) * z(s), s < t)
  z(t) = r + gamma * integral(Delta(s) * h(s), s < t)
action:
    integral(hat Delta(t) (Delta(t) - y) + hat K(t) K(t), t)
  + log E[exp(-integral(hat Delta(t) (u r - z(t) h(t)) / gamma + hat K(t) (h(t)^2 + z(t)^2), t))]
"""


_SQUARED_POINTS = ("hat Delta[mu](t) (Delta[mu](t) - y[mu]\n"
                   "                                       + (E[z[L, mu](t) phi(h[L, mu](t))] - "
                   "E[z[L, mu](0) phi(h[L, mu](0))]) / gamma)")


def weighted_loss(multi: str) -> str:
    """The text of specs/deep_multi.dmft (or an edit of it) trained on the weighted loss 1/2 sum_mu w_mu (y_mu -
    f_mu)^2: a parameter w[P] (default 1) and the error signal w[mu] (y[mu] - f[mu])."""
    assert _SQUARED_POINTS in multi
    weighted = (_SQUARED_POINTS.replace("(Delta[mu](t) - y[mu]\n", "(Delta[mu](t) - w[mu] * (y[mu]\n")
                .replace(" + (E[z", " - (E[z").replace("/ gamma)", "/ gamma))"))
    return multi.replace(_SQUARED_POINTS, weighted).replace(
        "param Kx[P, P]", 'param w[P] = 1.0 "per-point loss weights"\nparam Kx[P, P]', 1)
