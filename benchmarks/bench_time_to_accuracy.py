"""Benchmark: time to N Var of a given accuracy -- dmftc against extrapolated ensembles of trained networks.

Run: python benchmarks/bench_time_to_accuracy.py --kind two_layer [--T 100] [--gamma 1.5]
     python benchmarks/bench_time_to_accuracy.py --kind deep [--T 30] [--gamma 1] [--L 2] [--feature-factors 1 16]

The question a user asks: how long until I have lim N Var(q(t)) of every order parameter to within x% of its
peak?  Every method answers it in the same run, on the same machine:

* accuracy of a result = the worst, over the reported curves (every order parameter's N Var(t); deep: Delta, K
  and the time diagonals of Phi[l], G[l]) and over all times, of its standard error (the cubature's estimated
  error) divided by that curve's peak |N Var|.  The peaks are taken from the most accurate result of the run,
  so every method is measured against the same scale.
* each method runs a pilot of known size.  Its first call (JAX tracing and XLA compilation, one-off) is
  reported separately; the pilot time is a second, steady-state call of the same size with another seed.
* Monte Carlo (dmftc ``backend="mc"``, the deep propagator, the ensembles): the standard error falls as
  1/sqrt(size), so the time to a target accuracy a is t_pilot (a_pilot / a)^2, assuming the time is
  proportional to the size (paths or ensemble members).  That is conservative for dmftc's two-layer solve (its
  propagator, about 0.3 s, does not grow with the paths) and for randomised quasi-Monte Carlo (whose error may
  fall faster).  The deep solve's means march (fixed ``--samples``) is counted as a fixed cost: only the
  propagator's paths are scaled.
* cubature (dmftc ``backend="cubature"``): levels of n nodes per source coordinate are run in order until the
  estimated error is below the target; the time reported is the measured steady-state time of all the levels
  run (the last level's own time is printed below the table).
* ensembles: E networks at width N and E at 2N, extrapolated in 1/N (x = 2 x(2N) - x(N),
  dmftc.validation.extrapolate.richardson), whose N Var standard error sqrt(4 se(2N)^2 + se(N)^2) is the
  accuracy; time proportional to the members E.

A fast wrong answer must not win: the largest pointwise z = |dmftc - ensembles| / sqrt(se^2 + se^2) over all
curves and times is printed for every dmftc method (with hundreds of correlated points, values up to about 3.5
are expected; above ``Z_DISAGREE`` the table says the methods disagree).  The machine's load average is
printed at the start and the end: on a shared machine run it more than once.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
Z_DISAGREE = 4.5


@dataclass(frozen=True)
class Curves:
    """N Var(t) of each reported order parameter and its standard error (or estimated error), (T,) arrays."""
    nvar: dict
    se: dict


@dataclass(frozen=True)
class Pilot:
    """One method's measurements: its pilot (size, first-call and steady-state seconds, curves), the seconds to
    each target follow from them (:func:`seconds_to`)."""
    method: str
    size: str
    first: float
    seconds: float
    curves: Curves
    scaled: float | None = None          # the part of ``seconds`` that grows with the size (None: all of it)
    levels: tuple = ()                   # cubature: (name, steady seconds, Curves) of each level run, in order

    @property
    def final(self) -> Curves:
        """The method's most accurate curves (the finest cubature level; else the pilot's)."""
        return self.levels[-1][2] if self.levels else self.curves


def peaks(c: Curves) -> dict:
    """Each curve's peak |N Var| over time."""
    return {k: float(np.max(np.abs(v))) for k, v in c.nvar.items()}


def accuracy(c: Curves, peak: dict) -> float:
    """The worst relative error: max over curves and times of se(t) / peak of the curve."""
    return max(float(np.max(np.abs(c.se[k]))) / peak[k] for k in peak)


def worst(c: Curves, peak: dict) -> str:
    """Where the accuracy is set: the curve and time index of the largest se / peak."""
    k = max(peak, key=lambda n: float(np.max(np.abs(c.se[n]))) / peak[n])
    return f"{k} at step {int(np.argmax(np.abs(c.se[k])))}"


def time_to(seconds: float, acc: float, target: float, scaled: float | None = None) -> float:
    """Monte Carlo time to ``target`` from a pilot of ``seconds`` at accuracy ``acc`` (se proportional to
    1/sqrt(size), time to size): the fixed part ``seconds - scaled`` plus ``scaled`` (acc / target)^2."""
    grow = seconds if scaled is None else scaled
    return (seconds - grow) + grow * (acc / target) ** 2


def max_z(a: Curves, b: Curves) -> float:
    """Largest |a - b| / sqrt(se_a^2 + se_b^2) over the curves both carry and all times.  Points where both
    errors vanish (e.g. N Var Delta(0) = 0) count only if the values differ."""
    worst = 0.0
    for k in a.nvar.keys() & b.nvar.keys():
        d = np.asarray(a.nvar[k], float) - np.asarray(b.nvar[k], float)
        s = np.hypot(np.asarray(a.se[k], float), np.asarray(b.se[k], float))
        tiny = 1e-9 * max(1.0, float(np.max(np.abs(a.nvar[k]))))
        zero = s <= tiny
        if np.any(np.abs(d[zero]) > tiny):
            return math.inf
        if np.any(~zero):
            worst = max(worst, float(np.max(np.abs(d[~zero]) / s[~zero])))
    return worst


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# --- the methods -------------------------------------------------------------------------------------------


def two_layer_methods(args):
    import dmftc
    from dmftc.validation.truth import finite_width_truth

    model = dmftc.load(str(ROOT / "specs" / "two_layer.dmft"))
    names = ("Delta", "f_star", "K", "K_star")
    kw = dict(T=args.T, gamma=args.gamma)

    def curves(sol):
        return Curves({k: np.asarray(sol.var(k)) for k in names}, {k: np.asarray(sol.var_stderr(k)) for k in names})

    out = []
    _, first = timed(lambda: model.solve(backend="mc", samples=args.samples, seed=0, **kw))
    sol, sec = timed(lambda: model.solve(backend="mc", samples=args.samples, seed=1, **kw))
    params = dict(sol.params)
    out.append(Pilot("dmftc mc", f"{args.samples} paths", first, sec, curves(sol)))
    print(f"  dmftc mc: first call {first:.1f} s, steady {sec:.1f} s", flush=True)

    levels = []                     # (nodes per coordinate, first s, steady s, curves)
    for n in args.nodes:
        _, f = timed(lambda: model.solve(backend="cubature", samples=n ** 3, **kw))
        sol, s = timed(lambda: model.solve(backend="cubature", samples=n ** 3, **kw))
        d = sol.info["diagnostics"]["cubature"]
        levels.append((f"{d['nodes'][0]}^{d['coordinates']}", f, s, curves(sol)))
        acc = accuracy(levels[-1][3], peaks(levels[-1][3]))
        print(f"  dmftc cubature {levels[-1][0]} nodes: first call {f:.1f} s, steady {s:.1f} s, "
              f"accuracy {100 * acc:.3g}%", flush=True)
        if acc < min(args.targets):
            break
    name, first, sec, c = levels[0]
    out.append(Pilot("dmftc cubature", f"{name} nodes", first, sec, c,
                     levels=tuple((lv[0], lv[2], lv[3]) for lv in levels)))

    def ensembles():
        return finite_width_truth("two_layer", params, N=args.N, E=args.E, seed=args.seed, extrapolate=True)

    truth, sec = timed(ensembles)
    print(f"  ensembles: {sec:.1f} s", flush=True)
    out.append(Pilot("ensembles", f"{args.E} x N={args.N}, {2 * args.N}", math.nan, sec,
                     Curves({k: truth.nvar[k] for k in names}, {k: truth.nvar_se[k] for k in names})))
    return out


def deep_methods(args):
    from dmftc.deep import solve_deep
    from dmftc.validation.deep_ensemble import deep_names, deep_truth

    names = deep_names(args.L)
    kw = dict(activation="tanh", L=args.L, T=args.T, gamma=args.gamma, y=1.0, eta=args.eta, samples=args.samples,
              propagator_samples=args.paths, propagator_groups=args.groups)

    def run(seed, factor):
        sol, march = timed(lambda: solve_deep(seed=seed, propagator_feature_samples=factor * args.paths, **kw))
        c, prop = timed(lambda: Curves({k: np.asarray(sol.var(k)) for k in names},
                                       {k: np.asarray(sol.var_stderr(k)) for k in names}))
        return c, march, prop

    out = []
    for factor in args.feature_factors:            # 1: the plain estimator (features from the derivative paths)
        _, m0, p0 = run(0, factor)
        c, march, prop = run(1, factor)
        what = "plain" if factor == 1 else f"features x{factor}"
        print(f"  dmftc ({what}): first call {m0 + p0:.1f} s, steady: means march {march:.1f} s, propagator "
              f"{prop:.1f} s", flush=True)
        size = f"{args.paths} paths/{args.groups} groups" + ("" if factor == 1 else f", features x{factor}")
        out.append(Pilot(f"dmftc propagator, {what}", size, m0 + p0, march + prop, c, scaled=prop))

    def ensembles():
        return deep_truth(activation="tanh", L=args.L, gamma=args.gamma, y=1.0, eta=args.eta, T=args.T, N=args.N,
                          E=args.E, seed=args.seed)

    truth, sec = timed(ensembles)
    print(f"  ensembles: {sec:.1f} s", flush=True)
    out.append(Pilot("ensembles", f"{args.E} x N={args.N}, {2 * args.N}", math.nan, sec,
                     Curves({k: truth.nvar[k] for k in names}, {k: truth.se_nvar[k] for k in names})))
    return out


# --- the table ---------------------------------------------------------------------------------------------


def seconds_to(p: Pilot, peak: dict, target: float) -> tuple[float, str]:
    """(seconds, how) for one method and target.  Cubature: the measured steady-state time of running its levels in
    order until the estimated error is below the target (a user does not know the level in advance; that last
    level alone is named in ``how``).  Monte Carlo: the rate from the pilot."""
    if p.levels:
        total = 0.0
        for name, sec, c in p.levels:
            total += sec
            if accuracy(c, peak) < target:
                return total, (f"measured: levels {p.levels[0][0]} to {name} nodes ({name} alone "
                               f"{sec:.3g} s)")
        return math.nan, f"not reached at {p.levels[-1][0]} nodes"
    return time_to(p.seconds, accuracy(p.curves, peak), target, p.scaled), "extrapolated"


def table(pilots: list[Pilot], targets) -> list[dict]:
    """One row per method: accuracy against the common peaks (those of the most accurate result), seconds to each
    target, and for dmftc methods the ratio ensembles / dmftc and max z against the ensembles."""
    best = min((p.final for p in pilots), key=lambda c: accuracy(c, peaks(c)))
    peak = peaks(best)
    ens = next(p for p in pilots if p.method == "ensembles")
    rows = []
    for p in pilots:
        to = {a: seconds_to(p, peak, a) for a in targets}
        row = dict(method=p.method, size=p.size, first=p.first, seconds=p.seconds, accuracy=accuracy(p.curves, peak),
                   to=to, worst=worst(p.curves, peak))
        if p is not ens:
            row["ratio"] = {a: seconds_to(ens, peak, a)[0] / to[a][0] for a in targets}
            row["z"] = max_z(p.final, ens.curves)
        rows.append(row)
    return rows


def fmt(x: float, width: int) -> str:
    """Seconds (or a ratio) with three significant digits below 100, whole numbers above."""
    return f"{x:>{width}.3g}" if abs(x) < 100 else f"{x:>{width}.0f}"


def show(rows, targets) -> str:
    head = (f"{'method':<31} {'pilot size':<40} {'first call':>10} {'pilot s':>8} {'accuracy':>9}"
            + "".join(f" {f'to {100 * a:g}% s':>11}" for a in targets)
            + "".join(f" {f'x at {100 * a:g}%':>10}" for a in targets) + f" {'max z':>6}")
    lines = [head]
    for r in rows:
        first = f"{'n/a':>10}" if math.isnan(r["first"]) else fmt(r["first"], 10)
        line = (f"{r['method']:<31} {r['size']:<40} {first} {fmt(r['seconds'], 8)} {100 * r['accuracy']:>8.3g}%"
                + "".join(f" {fmt(r['to'][a][0], 11)}" for a in targets))
        if "ratio" in r:
            line += "".join(f" {fmt(r['ratio'][a], 10)}" for a in targets) + f" {r['z']:>6.2f}"
        lines.append(line)
    notes = [f"{r['method']}: to {100 * a:g}% {r['to'][a][1]}" for r in rows for a in targets
             if r["to"][a][1] != "extrapolated"]
    notes += [f"{r['method']}: pilot accuracy set by {r['worst']}" for r in rows]
    bad = [r["method"] for r in rows if r.get("z", 0) > Z_DISAGREE]
    lines += notes
    lines.append(f"DISAGREE (max z > {Z_DISAGREE}): {', '.join(bad)}" if bad else
                 f"agreement: every dmftc method within max z {Z_DISAGREE} of the ensembles")
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("two_layer", "deep"), default="two_layer")
    ap.add_argument("--T", type=int, default=None, help="time steps (default: 100 two_layer, 30 deep)")
    ap.add_argument("--gamma", type=float, default=None, help="default: 1.5 two_layer, 1 deep")
    ap.add_argument("--targets", type=float, nargs="+", default=[0.02, 0.005], help="relative accuracies")
    ap.add_argument("--samples", type=int, default=None,
                    help="dmftc mc paths (two_layer, default 20000) or the deep means march's (default 20000)")
    ap.add_argument("--nodes", type=int, nargs="+", default=[6, 8, 10, 12, 14, 16, 20, 24],
                    help="cubature levels: nodes per source coordinate, tried in order (two_layer)")
    ap.add_argument("--L", type=int, default=2, help="hidden layers (deep)")
    ap.add_argument("--eta", type=float, default=0.05, help="step size (deep)")
    ap.add_argument("--paths", type=int, default=2000, help="deep propagator source paths")
    ap.add_argument("--groups", type=int, default=8, help="deep propagator groups")
    ap.add_argument("--feature-factors", type=int, nargs="+", default=[1, 16],
                    help="deep: feature paths per derivative path, one dmftc row each (1: the plain estimator; "
                         "the solve's default is 16)")
    ap.add_argument("--N", type=int, default=256, help="ensemble width (and 2N)")
    ap.add_argument("--E", type=int, default=None, help="ensemble members per width (default 4000 two_layer, 500 deep)")
    ap.add_argument("--seed", type=int, default=0, help="ensemble seed")
    args = ap.parse_args(argv)
    deep = args.kind == "deep"
    for k, two, dp in (("T", 100, 30), ("gamma", 1.5, 1.0), ("samples", 20000, 20000), ("E", 4000, 500)):
        if getattr(args, k) is None:
            setattr(args, k, dp if deep else two)
    args.targets = sorted(args.targets, reverse=True)
    return args


def main(argv=None) -> list[dict]:
    args = parse(argv)
    what = (f"two_layer.dmft, T = {args.T}, gamma = {args.gamma}" if args.kind == "two_layer" else
            f"deep tanh, L = {args.L}, T = {args.T}, gamma = {args.gamma}, eta = {args.eta}")
    print(f"time to accuracy: {what}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    pilots = (two_layer_methods if args.kind == "two_layer" else deep_methods)(args)
    rows = table(pilots, args.targets)
    print(show(rows, args.targets))
    print(f"load average at the end {os.getloadavg()[0]:.2f}; times in s, 'x' = ensembles' time / dmftc's")
    return rows


if __name__ == "__main__":
    main()
