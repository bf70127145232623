"""Command line: ``dmftc compile | derive | run``.

Exit codes: 0 success, 1 spec error, 2 usage error (bad arguments or
parameters), 3 numerical failure.
"""
from __future__ import annotations

import argparse
import ast as pyast
import os
import sys
from pathlib import Path

from dmftc.errors import DmftcError, ParameterError, SpecError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit with 2 and no traceback
        self.print_usage(sys.stderr)
        print(f"dmftc: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parse_value(text: str, name: str):
    try:
        value = pyast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ParameterError(f"--set {name}={text}: value must be a number or a nested list of numbers") from None
    return value


def cmd_compile(args) -> int:
    from dmftc.compiler import compile_spec, is_stale, output_path

    stale = []
    for spec in args.specs:
        if args.check:
            if is_stale(spec, args.output):
                stale.append(spec)
                print(f"stale: {output_path(spec, args.output)} (run `dmftc compile {spec}`)")
            continue
        target, changed = compile_spec(spec, args.output)
        if not args.quiet:
            print(f"{'wrote' if changed else 'up to date'}: {target}")
    return 1 if stale else 0


def cmd_derive(args) -> int:
    from dmftc.compiler import front_end, front_end_ir
    from dmftc.derive.report import format_derivation

    if args.ir:
        from dmftc.ir.text import format_ir
        print(format_ir(front_end_ir(Path(args.spec))[1]))
        return 0
    _, deriv = front_end(Path(args.spec))
    print(format_derivation(deriv, latex=args.latex))
    return 0


def cmd_run(args) -> int:
    from dmftc.compiler import load

    params = {}
    for item in args.set or []:
        if "=" not in item:
            raise ParameterError(f"--set expects name=value, got {item!r}")
        k, v = item.split("=", 1)
        params[k.strip()] = _parse_value(v.strip(), k.strip())
    model = load(args.spec)
    if args.width is not None and args.width < 1:
        raise ParameterError(f"--width must be a positive integer, got {args.width}")
    # the options are checked alike for every kind of spec (dmftc.runtime.options: e.g. --propagator-samples is
    # for deep specs only)
    sol = model.solve(samples=args.samples, seed=args.seed, backend=args.backend, sampler=args.sampler,
                      propagator_samples=args.propagator_samples, correction=args.width is not None,
                      progress=not args.quiet, **params)
    if not args.quiet:
        print(sol.summary())
        if args.width is not None:
            print(width_summary(sol, args.width))
    if args.out:
        sol.save(args.out)
        if not args.quiet:
            print(f"wrote {args.out}")
    if args.plot:
        from dmftc.runtime.plot import plot_solution
        plot_solution(sol, args.plot, width=args.width)
        if not args.quiet:
            print(f"wrote {args.plot}")
    return 0


def width_summary(sol, N: int) -> str:
    """The predicted ensemble at width N: final mean with its O(1/N) correction and spread, and the loss."""
    import numpy as np

    T = len(sol.times)
    lines = [f"at width N = {N} (final step; mean +- 2 sqrt(Sigma / N), correction m1 / N +- its standard error):"]
    deep = getattr(sol, "kind", None) == "deep"       # deep kernels are (T, T): report their time diagonal
    final = (lambda a: np.diagonal(a)[-1] if np.ndim(a) == 2 else a[-1]) if deep else (lambda a: a[..., -1])
    for n in getattr(sol, "observables", sol.names):
        m, mw, v = final(sol.mean(n)), final(sol.mean_at_width(n, N)), sol.var(n)[..., -1]
        c, cs = final(sol.mean_correction(n)) / N, final(sol.mean_correction(n, stderr=True)) / N
        for k, idx in enumerate(np.ndindex(np.shape(m))):
            label = n + (f"[{', '.join(str(i + 1) for i in idx)}]" if idx else "")
            lines.append(f"  {label:<16} {float(np.asarray(mw)[idx]):>10.5g} +- {2 * np.sqrt(max(float(np.asarray(v)[idx]), 0) / N):<9.3g}"
                         f" (N = inf: {float(np.asarray(m)[idx]):.5g}; shift {float(np.asarray(c)[idx]):+.3g} +- "
                         f"{float(np.asarray(cs)[idx]):.2g})")
            if k >= 7:
                lines.append(f"  ... ({int(np.size(m))} components of {n})")
                break
    err = getattr(getattr(sol, "module", None), "ERROR_SIGNAL", "Delta")
    if err in sol.names:
        loss, se = sol.expected_loss(N, err)[-1], sol.expected_loss(N, err, stderr=True)[-1]
        inf = float((sol.mean(err).reshape(-1, T)[:, -1] ** 2).sum())
        lines.append(f"  expected loss sum_mu E[Delta_mu^2] = {loss:.5g} +- {se:.2g} (N = inf: {inf:.5g})")
    if sol.info.get("mean_correction", {}).get("approximation"):
        lines.append("  warning: " + sol.info["mean_correction"]["approximation"])
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dmftc", description="Compile DMFT specs (.dmft) to JAX kernels and solve them.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("compile", help="generate the Python module of one or more specs")
    c.add_argument("specs", nargs="+")
    c.add_argument("-o", "--output", default=None,
                   help="output directory (default: generated/ of this repository for its specs, else generated/ "
                        "beside the spec)")
    c.add_argument("--check", action="store_true", help="exit 1 if a generated module is missing or stale")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(func=cmd_compile)
    d = sub.add_parser("derive", help="print the derived equations and Hessian blocks")
    d.add_argument("spec")
    d.add_argument("--latex", action="store_true")
    d.add_argument("--ir", action="store_true", help="print the intermediate representation the spec lowers to")
    d.set_defaults(func=cmd_derive)
    r = sub.add_parser("run", help="compile if needed, solve, print a summary")
    r.add_argument("spec")
    r.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a parameter (repeatable)")
    r.add_argument("--samples", type=int, default=20000)
    r.add_argument("--propagator-samples", type=int, default=None, metavar="S",
                   help="deep nonlinear specs: source paths of the finite-width propagator (default 4000)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--sampler", choices=("sobol", "random"), default=None,
                   help="standard normals of the sample groups: randomised quasi-Monte Carlo or pseudo-random "
                        "(default: sobol for deep propagators, random for two-layer specs)")
    r.add_argument("--backend", choices=("auto", "exact", "mc"), default="auto")
    r.add_argument("--out", metavar="NPZ", help="save the results (reload with dmftc.Solution.load)")
    r.add_argument("--plot", metavar="PNG", help="save a figure of means and variances")
    r.add_argument("--width", type=int, metavar="N", help="two-layer and deep linear specs: also compute the O(1/N) correction to "
                   "the mean and report the mean, its spread and the expected loss at width N")
    r.add_argument("-q", "--quiet", action="store_true")
    r.set_defaults(func=cmd_run)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    except DmftcError as err:
        print(f"dmftc: error: {err}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:           # the reader closed the pipe (dmftc derive SPEC | head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at interpreter exit
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
