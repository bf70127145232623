"""Fixed copies of shipped specs for tests, so edits of specs/ do not change them."""

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
