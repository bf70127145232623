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
from dmftc.jax_setup import fewer_collections


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit with 2 and no traceback
        self.print_usage(sys.stderr)
        print(f"dmftc: error: {message}", file=sys.stderr)
        raise SystemExit(2)


class UsageError(ParameterError):
    """A bad command-line argument (exit 2), with an optional hint printed under the message."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def render(self) -> str:
        return f"dmftc: error: {self}" + (f"\n  hint: {self.hint}" if self.hint else "")


PLOT_SUFFIXES = (".png", ".pdf", ".svg")
OUT_SUFFIXES = (".npz", ".nc")


def check_spec_file(path) -> Path:
    """A spec named on the command line must be an existing, readable file (else exit 2: a bad argument)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"no such spec file: {path}")
    if not path.is_file():
        raise UsageError(f"not a spec file: {path} is a directory" if path.is_dir() else f"not a spec file: {path}")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read spec file: {path} (permission denied)")
    return path


def check_output_path(path, option: str, suffixes: tuple[str, ...]) -> Path:
    """An output file of ``run`` is checked before the solve: a known suffix, an existing writable directory
    (never created silently), and not itself a directory."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {path}: the file name must end in {', '.join(suffixes[:-1])} or {suffixes[-1]}"
                         + (f", not {path.suffix}" if path.suffix else ""))
    parent = path.parent
    if not parent.exists():
        raise UsageError(f"{option} {path}: directory {parent} does not exist", hint=f"mkdir -p {parent}")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: {parent} is not a directory")
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: directory {parent} is not writable")
    return path


def check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError('--plot needs matplotlib: pip install "dmftc[plot]"') from None


def _parse_value(text: str, name: str):
    try:
        value = pyast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ParameterError(f"--set {name}={text}: value must be a number or a nested list of numbers") from None
    return value


def cmd_compile(args) -> int:
    from dmftc.compiler import compile_spec, is_stale, output_path

    for spec in args.specs:
        check_spec_file(spec)
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

    check_spec_file(args.spec)
    if args.ir:
        from dmftc.ir.text import format_ir
        print(format_ir(front_end_ir(Path(args.spec))[1]))
        return 0
    _, deriv = front_end(Path(args.spec))
    print(format_derivation(deriv, latex=args.latex))
    return 0


def cmd_run(args) -> int:
    from dmftc.compiler import load

    # everything a user can get wrong on the command line is checked before the (long) solve
    check_spec_file(args.spec)
    if args.out:
        check_output_path(args.out, "--out", OUT_SUFFIXES)
    if args.plot:
        check_output_path(args.plot, "--plot", PLOT_SUFFIXES)
        check_matplotlib()
    if args.width is not None and args.width < 1:
        raise ParameterError(f"--width must be a positive integer, got {args.width}")
    params = {}
    for item in args.set or []:
        if "=" not in item:
            raise ParameterError(f"--set expects name=value, got {item!r}")
        k, v = item.split("=", 1)
        params[k.strip()] = _parse_value(v.strip(), k.strip())
    model = load(args.spec)
    # the options are checked alike for every kind of spec (dmftc.runtime.problem.options: e.g. --propagator-samples is
    # for deep specs only)
    sol = model.solve(samples=args.samples, seed=args.seed, backend=args.backend, sampler=args.sampler,
                      propagator_samples=args.propagator_samples,
                      propagator_feature_samples=args.propagator_feature_samples, correction=args.width is not None,
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
        from dmftc.runtime.results.plot import plot_solution
        plot_solution(sol, args.plot, width=args.width)
        if not args.quiet:
            print(f"wrote {args.plot}")
    return 0


def width_summary(sol, N: int) -> str:
    """The predicted ensemble at width N: final mean with its O(1/N) correction and spread, and the loss."""
    import numpy as np

    T = len(sol.times)
    lines = [f"at width N = {N} (final step; mean +- 2 sqrt(Sigma / N), correction m1 / N +- its standard error):"]
    for n in getattr(sol, "observables", sol.names):
        two = sol.time_axes(n) == 2                     # a deep kernel (.., T, T): its time diagonal
        final = (lambda a: np.diagonal(a, axis1=-2, axis2=-1)[..., -1]) if two else (lambda a: a[..., -1])
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


EPILOG = ("exit codes: 0 success, 1 error in a spec, 2 bad arguments or parameters, 3 numerical failure. "
          "See docs/cli.md.")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dmftc", description="Compile DMFT specs (.dmft) to JAX kernels and solve them.", epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("compile", help="generate the Python module of one or more specs")
    c.add_argument("specs", nargs="+", metavar="SPEC", help="spec file(s), .dmft")
    c.add_argument("-o", "--output", default=None,
                   help="output directory (default: generated/ of this repository for its specs, else generated/ "
                        "beside the spec)")
    c.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated module is missing "
                   "or stale")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    c.set_defaults(func=cmd_compile)
    d = sub.add_parser("derive", help="print the derived equations and Hessian blocks")
    d.add_argument("spec", metavar="SPEC", help="spec file, .dmft")
    d.add_argument("--latex", action="store_true", help="print the equations as a LaTeX fragment (amsmath)")
    d.add_argument("--ir", action="store_true", help="print the intermediate representation the spec lowers to")
    d.set_defaults(func=cmd_derive)
    r = sub.add_parser("run", help="compile if needed, solve, print a summary")
    r.add_argument("spec", metavar="SPEC", help="spec file, .dmft")
    r.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="override a parameter of the spec (repeatable). VALUE is a number or, for an array "
                        "parameter, a nested list in Python syntax with the parameter's shape; quote it for the "
                        "shell (brackets are glob characters): --set T=50 --set \"y=[1, -1, 0.5]\" "
                        "--set \"Kx=[[1, 0.5], [0.5, 1]]\"")
    r.add_argument("--samples", type=int, default=20000, help="single-site Monte Carlo paths (default 20000)")
    r.add_argument("--propagator-samples", type=int, default=None, metavar="S",
                   help="deep nonlinear specs: source paths of the finite-width propagator (default 4000)")
    r.add_argument("--propagator-feature-samples", type=int, default=None, metavar="S",
                   help="deep nonlinear specs: paths whose features give the propagator's feature covariance, its "
                        "largest source of noise (default 16 times --propagator-samples; equal to it: none added)")
    r.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    r.add_argument("--sampler", choices=("sobol", "random"), default=None,
                   help="standard normals of the sample groups: randomised quasi-Monte Carlo or pseudo-random "
                        "(default: sobol for deep propagators, random for two-layer specs)")
    r.add_argument("--backend", choices=("auto", "exact", "mc", "cubature"), default="auto",
                   help="exact: Gaussian moments (linear processes only); mc: Monte Carlo; cubature: Gauss-Hermite "
                        "nodes over the sources, at most --samples of them, error from two levels (two-layer "
                        "specs); auto (default): exact when the process is proven linear, cubature for a smooth "
                        "activation on at most 3 source coordinates (not with --width or --sampler), else mc")
    r.add_argument("--out", metavar="FILE", help="save the results to FILE.npz or FILE.nc (reload with "
                   "dmftc.Solution.load); the directory must exist")
    r.add_argument("--plot", metavar="FILE", help="save a figure of means and variances to FILE.png, .pdf or .svg "
                   "(needs matplotlib); the directory must exist")
    r.add_argument("--width", type=int, metavar="N", help="two-layer and deep linear specs: also compute the O(1/N) correction to "
                   "the mean and report the mean, its spread and the expected loss at width N")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    r.set_defaults(func=cmd_run)
    return p


def main(argv=None) -> int:
    fewer_collections()          # the command line owns its process; JAX's tracing then spends less time collecting
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, UsageError) as err:
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
