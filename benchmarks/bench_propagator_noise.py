"""Benchmark: where the deep propagator's Monte Carlo noise comes from, block by block of the action's Hessian.

Run: python benchmarks/bench_propagator_noise.py [--activation tanh] [--L 2] [--T 10] [--groups 8] [--paths 250]
         [--gamma 1.0] [--eta 0.05] [--y 1.0]

Each group of :func:`dmftc.runtime.engines.deep_propagator.deep_propagator` solves Sigma = U^-1 Kd U^-T with its
own Monte Carlo Hessian blocks: U (dual x primal) and Kd (dual x dual; the duals are the kernels' hats, the
readout's Delta_hat and the anti-causal entries of the responses A, B).  The groups are solved again with one part
of the Hessian their own and the rest pooled over all groups (the pooled blocks' noise is G times smaller), and the
table gives, per observable, the spread over groups of N Var on the time diagonal (largest over time, relative to
the curve's peak) for:

* both        the group's own U and Kd (the propagator as solved);
* U only      its own U, the pooled Kd;
* Kd only     the pooled U, its own Kd;
* hat-hat     the pooled U and Kd but the hat-hat block of its own Kd: the covariance over the paths of the
              features (the kernels' factor products phi(h(t)) phi(h(s)), g(t) g(s) and the readout), which the
              march alone gives, without any derivative of the paths;
* anti-anti, hat-anti   the other blocks of Kd likewise (second derivatives of the paths' log-weights).

Measured on one 2-core machine (8 groups of 250 Sobol' paths, gamma = 1, eta = 0.05, L = 2): for tanh at T = 10
and 20 and for sin at T = 10 the hat-hat block carries the noise (5-18% of the peak against at most 1% from U and
1.6% from the other blocks); for the steep tanh(3 h) at T = 10 it is U (the Price-theorem blocks,
:mod:`dmftc.runtime.solvers.solve_bias`), where 250 paths per group do not resolve the propagator at all.  Where
the hat-hat block dominates, the propagator now takes it from more paths marched at each group's saddle
(``feature_samples``, :mod:`dmftc.runtime.sensitivities.held_paths`); this benchmark solves the plain estimator's
groups (docs/how-it-works.md, "Where the deep propagator's noise comes from").
"""
from __future__ import annotations

import argparse

import numpy as np

from dmftc.runtime.engines.deep_propagator import group_propagator
from dmftc.runtime.numerics.sampling import source_normals
from dmftc.runtime.problem.deep_action import Layout
from dmftc.runtime.solvers.causal_solve import CausalBlocks, causal_propagator


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--activation", default="tanh", help="an expression in h or a shorthand")
    ap.add_argument("--L", type=int, default=2)
    ap.add_argument("--T", type=int, default=10)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--paths", type=int, default=250, help="paths per group")
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--eta", type=float, default=0.05)
    ap.add_argument("--y", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    L, T, G = a.L, a.T, a.groups
    runs = []
    for g in range(G):
        xi = source_normals("sobol", np.random.SeedSequence([a.seed, g]), L, a.paths, T)
        runs.append(group_propagator(activation=a.activation, L=L, T=T, xiu=xi[0], xir=xi[1], gamma=a.gamma,
                                     y=a.y, eta=a.eta, keep_blocks=True))
    blocks = [r.blocks for r in runs]
    order, pp = blocks[0].order, max(b.primal_block_max for b in blocks)
    U_pool, K_pool = sum(b.U for b in blocks) / G, sum(b.Kd for b in blocks) / G
    names = ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]

    def solved(run, U, Kd):
        P = causal_propagator(run.saddle, CausalBlocks(order, U, Kd, pp), model=run.saddle.model)
        return {n: np.diag(P.sigma[n][n]) for n in names}

    lay = Layout(L, T)
    var_names = np.empty(lay.n, object)
    for name, (o, size) in lay.blocks.items():
        var_names[o:o + size] = name
    hat = np.array(["hat" in v for v in var_names[order.dual]])
    masks = {"hat-hat": np.outer(hat, hat), "anti-anti": np.outer(~hat, ~hat)}
    masks["hat-anti"] = ~(masks["hat-hat"] | masks["anti-anti"])
    cases = {"both": [{n: np.diag(r.sigma[n][n]) for n in names} for r in runs],
             "U only": [solved(r, b.U, K_pool) for r, b in zip(runs, blocks)],
             "Kd only": [solved(r, U_pool, b.Kd) for r, b in zip(runs, blocks)]}
    for label, mask in masks.items():
        cases[label] = [solved(r, U_pool, np.where(mask, b.Kd, K_pool)) for r, b in zip(runs, blocks)]
    print(f"{a.activation}, L = {L}, T = {T}, gamma = {a.gamma}, eta = {a.eta}, y = {a.y}: {G} groups of {a.paths} "
          f"Sobol' paths; duals: {int(hat.sum())} hats, {int((~hat).sum())} anti-causal couplings")
    print("spread over groups of N Var (largest over time) / peak, with only the named part of the Hessian the group's own:")
    print(f"  {'name':<8}" + "".join(f"{c:>11}" for c in cases))
    for n in names:
        peak = max(float(np.abs(np.mean([x[n] for x in cases["both"]], axis=0)).max()), 1e-300)
        row = [np.array([x[n] for x in cases[c]]).std(axis=0, ddof=1).max() / peak for c in cases]
        print(f"  {n:<8}" + "".join(f"{v:>11.3f}" for v in row))


if __name__ == "__main__":
    main()
