"""The saddle and the propagator of a one-time single-site program through the site march (issue 12, one
engine): a two-layer spec lowered by :mod:`dmftc.derive.site_lowering`.

The order parameters q_k(t) are the readouts of the program: q = F(q), where F solves each readout constraint
from the single-site averages of the paths marched with the order parameters held at q
(:func:`dmftc.runtime.march.site_march.replay_march`).  The saddle is the march that solves them step by step.  At
the saddle, with the paths' averages replaced by their finite-width fluctuations, the paper's recipe gives the
propagator of the one-time order parameters, written here in the solved form of the constraints:

    U = 1 - dF/dq   (the whole trajectory: lower triangular in time; explicit couplings, same-time
                     constraints and the sensitivities D of the averages alike: in the order parameters the
                     fields and running sums read, by the program's printed tangents in one march
                     (dmftc.runtime.sensitivities.site_drivers); in the others, by autodiff of the readouts alone)
    kappa = Cov_paths(Y),  Y_k(t) = sum_a dF_k(t)/d<O_a(t)> O_a(t)   (the averages' fluctuations)
    Sigma = U^-1 kappa U^-T

which equals the two-layer engine's (:mod:`dmftc.reference.two_layer_engine`: constraints coeff q + rest = <O>, U with
coeff on its diagonal, kappa = Cov(O)) row by row up to the factor 1 / coeff (tests/test_site_two_layer.py: to
round-off on the same paths).  A kink differentiates as in the two-layer engine's symbolic tangents: the program
prints Heaviside (relu's phi') as ``kernels.step``, whose derivative is the delta function as a Gaussian of the
solve's ``dirac width``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import NumericalError, ParameterError, StructureSpecError
from dmftc.jax_setup import long_run_options, march_options
from dmftc.runtime.numerics.devices import like_paths, mesh_of, place_paths, rows_for
from dmftc.runtime.numerics.geometry import source_factors
from dmftc.runtime.numerics.march_numerics import array_module
from dmftc.runtime.solvers.linalg import (block_inverses, cross_components, factor, right_solve, sandwich,
                                  time_major_edges)
from dmftc.runtime.march.site_march import constraint_pass, readout_pass, replay_march, site_march
from dmftc.runtime.sensitivities.site_drivers import (driver_columns, equal_batches, pad_rows, path_batch, tangent_method,
                                        tangent_segments)
from dmftc.runtime.march.site_layout import Flat, canonical
from dmftc.runtime.problem.spec_kernels import module_key
from dmftc.runtime.sensitivities.site_transfer import SEGMENT

__all__ = ["causal_solver", "centred", "check_finite", "exact_points", "group_saddle", "group_sensitivities",
           "identity_minus", "layout_arrays", "normals_of", "paths_at", "require_program", "two_layer_exact",
           "two_layer_mean_correction", "two_layer_propagator", "two_layer_saddle"]


def require_program(mod):
    """The module's single-site program, or a clear error: why it has none, or that it predates them."""
    if getattr(mod, "SITE", None) is None:
        why = getattr(mod, "SITE_MISSING", None)
        raise StructureSpecError(f"{mod.SPEC_PATH}: no single-site program in its generated module, which the "
                                 "solver marches" + (f": {why}" if why else " (recompile it: dmftc compile)"))
    return mod.SITE


def normals_of(mod, draws) -> dict:
    """{source: (S,) or (S, its index)} from ``draws[k]`` (S, n_k), the k-th jointly Gaussian source group
    (``mod.SOURCES``): an indexed source is its group's draws."""
    if len(draws) != len(mod.SOURCES):
        raise ParameterError(f"{mod.MODEL} has {len(mod.SOURCES)} source groups, got {len(draws)} arrays of draws")
    out = {}
    for group, x in zip(mod.SOURCES, draws):
        # host draws stay numpy (slicing them eagerly in JAX would compile a program per shape); traced ones JAX
        x = array_module(x).asarray(x, np.float64)
        x = x.reshape(x.shape[0], -1)
        if len(group) == 1 and group[0][1]:
            out[group[0][0]] = x
        else:
            out.update({name: x[:, j] for j, (name, _) in enumerate(group)})
    return out


_JIT: dict = {}

# paths x (steps x observables)^2 of a solve above which its tangent programs (the drivers' columns, the mean
# correction's batches) count as long runs, compiled at XLA's full optimisation whatever XLA_FLAGS asks
# (:func:`dmftc.jax_setup.long_run_options`; users' runs are there already).  Measured under the test suite's
# lowered flags, one thread: two_layer_multi at T = 60, P = 3 (2500 paths a group: 1.3e9) solved in 9.8 s of CPU
# instead of 17.8 s, and multi_tanh's mean correction (3000 paths, T = 30, 20 observables: 1.1e9) gained 2 s;
# two_layer at T = 30 (4000 paths: 5.8e7) lost 0.8 s to the longer compilation
LONG_RUN_WORK = 3e8


def long_run(S: int, T: int, m: int) -> bool:
    """Whether the tangent programs of S paths, T steps and m observables a step run long (``LONG_RUN_WORK``)."""
    return S * (T * m) ** 2 >= LONG_RUN_WORK


def _compiled(kind, mod, sz: dict, T: int, S: int, width: float, fn, long: bool = False):
    """One jitted function per (module, sizes, steps, paths, delta width): repeated solves, and solves of the
    same compiled spec loaded again, reuse it.  ``long``: compiled as a long run (``LONG_RUN_WORK``)."""
    key = (kind, module_key(mod), tuple(sorted((k, int(v)) for k, v in sz.items())), T, S, width, long)
    if key not in _JIT:
        _JIT[key] = jax.jit(fn, compiler_options=march_options() | (long_run_options() if long else {}))
    return _JIT[key]


def _setup(mod, draws, p, sz):
    require_program(mod)
    normals = normals_of(mod, draws)
    S = int(next(iter(normals.values())).shape[0])
    pj = {k: jnp.asarray(v, jnp.float64) for k, v in p.items()}
    return normals, S, pj, float(p.get("dirac width", 0.0))


def layout_arrays(mod, q, sz, T):
    stored = dict(mod.SITE["stored"])
    axes = dict(mod.SITE["axes"])
    return {n: canonical(mod, n, np.asarray(v)).reshape(tuple(int(sz[axes[i]]) for i in stored[n]) + (T,))
            for n, v in q.items()}


def two_layer_saddle(mod, draws, p: dict, sz: dict, T: int) -> dict:
    """The saddle-point march of a two-layer module's single-site program on given source draws (``draws[k]``
    (S, n_k) for the k-th source group of ``mod.SOURCES``; ``p``, ``sz``: the resolved parameters and sizes,
    dmftc.runtime.problem.params).  Returns {order parameter: (*index dims, T)}: the trajectories of
    dmftc.reference.two_layer_engine.saddle_on_draws."""
    normals, S, pj, width = _setup(mod, draws, p, sz)
    return layout_arrays(mod, group_saddle(mod, normals, jnp.full(S, 1.0 / S), pj, sz, T, width), sz, T)


def _solved_observables(mod, c, F: Flat):
    """The paths' observables in the solved form of the constraints, {name: (S, index dims, T)}: the sum over a
    readout's averages of d(solution)/d(average) times the path's value of the average."""
    Y = {n: jnp.zeros(F.shapes[n]) for n in F.names}
    for name, syms in mod.SITE["readouts"]:
        for sym in syms:
            Y[name] = Y[name] + c["dv"][(name, sym)] * c["paths"][sym]
    return Y


def _flat_paths(mod, c, F: Flat, S: int):
    """(S, T m): each path's solved-form observables (:func:`_solved_observables`) from a replay ``c``."""
    Y = _solved_observables(mod, c, F)
    Y = {n: jnp.broadcast_to(v, (S,) + F.shapes[n][1:]) for n, v in Y.items()}
    return jax.vmap(lambda i: F.flat({n: v[i][None] for n, v in Y.items()}))(jnp.arange(S))


def paths_at(mod, normals, wts, pj, q, sz, T: int, width: float):
    """(S, T m), uncentred: the solved-form observables of the paths ``normals`` marched with the order
    parameters held at ``q`` (layout), e.g. an exact saddle's."""
    S = int(wts.shape[0])
    F = Flat(mod, {n: v.shape for n, v in q.items()}, T)

    def run(nm, w, pj, q):
        c = replay_march(mod, (), 1, T, {}, w, pj, q, direct=True, width=width, normals=nm, sizes=dict(sz),
                         history=False)
        return _flat_paths(mod, c, F, S)
    return np.asarray(_compiled("paths", mod, sz, T, S, width, run)(normals, wts, pj, q))


def _replay_core(mod, normals, wts, pj, q, sz, T, width, kinks):
    """At the order parameters ``q`` (layout), from one replay of the paths: dF/dq in the order parameters the
    fields do not read (T m, those columns), the paths' solved-form observables (S, T m), uncentred, the averages
    {average: (1, index dims, T)} and, per kink field in ``kinks``, the weighted fraction of the paths and
    components whose field changes sign 3 or more times along the trajectory."""
    kw = dict(width=width, normals=normals, sizes=dict(sz))
    F = Flat(mod, {n: v.shape for n, v in q.items()}, T)
    q0 = F.flat(q)
    c = replay_march(mod, (), 1, T, {}, wts, pj, q, direct=True, **kw)
    rest = np.flatnonzero(~F.drivers())
    J = jnp.zeros((T * F.m, rest.size))
    if rest.size:                 # the fields do not read these: through the readouts alone
        fn = lambda qv: F.flat(readout_pass(mod, T, wts, pj, F.unflat(qv), c["rec_hist"],   # noqa: E731
                                            rsums=c["rec_sums"], **kw))
        J = jax.jacfwd(lambda x: fn(q0.at[rest].set(x)))(q0[rest])
    Yflat = _flat_paths(mod, c, F, wts.shape[0])
    avg = {sym: c["avg"][("direct", sym)] for _, syms in mod.SITE["readouts"] for sym in syms}
    chatter = {}
    for f in kinks:
        side = c["rec_hist"][(f, 1)] > 0                                    # (S, index dims, T)
        many = (jnp.sum(side[..., 1:] != side[..., :-1], axis=-1) >= 3).reshape(side.shape[0], -1)
        chatter[f] = wts @ jnp.mean(many, axis=1)
    return J, Yflat, avg, chatter


def group_saddle(mod, normals, wts, pj, sz, T: int, width: float):
    """The saddle of one group of paths (weights ``wts``, 0 on padding rows): the order parameters in the layout
    {name: (1, index dims, T)}."""
    S = int(wts.shape[0])
    fn = _compiled("saddle march", mod, sz, T, S, width, lambda nm, w, pj: site_march(
        mod, (), 1, T, {}, w, pj, direct=True, width=width, normals=nm, sizes=dict(sz))[1])
    return fn(normals, wts, pj)


def group_sensitivities(mod, normals, wts, pj, q, sz, T: int, width: float, batch: int | None = None,
                        kinks: tuple = (), segments: int | None = None, tangents: str | None = None,
                        paths_ready=None):
    """At the order parameters ``q`` (layout; a group's saddle), from the group's paths ``normals`` with weights
    ``wts`` (summing to 1; 0 on padding rows): dF/dq (T m, T m) (numpy), the paths' solved-form observables Y
    (S, T m), uncentred, the averages (layout) and the chattering fractions of the kink fields ``kinks``.  The
    drivers' columns are computed in batches of :func:`path_batch` paths, by ``tangents`` (:func:`tangent_method`),
    the march cut into ``segments`` causal pieces (default: pieces of ``site_transfer.SEGMENT`` steps for the
    transfer matrices, :func:`tangent_segments` for the tangent march).  ``paths_ready``: called with Y as soon
    as the replay gives it, before the drivers' columns are computed (so that the caller's work on Y, e.g. on
    another thread, overlaps them)."""
    S = int(wts.shape[0])
    shapes = {n: v.shape for n, v in q.items()}
    F = Flat(mod, shapes, T)
    replay = _compiled(("replay", tuple(kinks)), mod, sz, T, S, width,
                       lambda nm, w, pj, q: _replay_core(mod, nm, w, pj, q, sz, T, width, kinks))
    Jrest, Y, avg, chatter = replay(normals, wts, pj, q)
    Y = np.asarray(Y)
    if paths_ready is not None:
        paths_ready(Y)
    J = np.zeros((T * F.m, T * F.m))
    drive = F.drivers()
    J[:, ~drive] = np.asarray(Jrest)
    if drive.any():
        B, batches = equal_batches(S, path_batch(mod, sz, T, S, batch, tangents))
        B = rows_for(B, mesh_of(wts))         # paths sharded over devices: batches too (one device: B)
        method = tangent_method(mod, tangents)
        K = (int(segments) if segments is not None else -(-T // SEGMENT) if method == "transfer"
             else tangent_segments(mod, sz, T, B))
        run, idx = driver_columns(mod, sz, T, width, shapes, K, method)
        fn = _compiled(("drivers", B, K, method), mod, sz, T, S, width, run, long_run(S, T, F.m))
        total = np.zeros((T * F.m, idx.size))
        for k, (a, n) in enumerate(batches):
            nm, w = like_paths(({key: pad_rows(v[a:a + n], B) for key, v in normals.items()},
                                pad_rows(wts[a:a + n], B)), wts)
            part = fn(nm, w, pj, q, avg, jnp.float64(k == 0))
            total += np.asarray(part)
        J[:, idx] = total
    return J, Y, avg, {f: float(v) for f, v in chatter.items()}


def centred(Y, wts):
    """The rows of Y with nonzero weight (zero marks padding; a sparse grid's weights may be negative), centred by
    their weighted mean."""
    w = np.asarray(wts)
    keep = w != 0
    if not keep.all():
        Y, w = Y[keep], w[keep]
    return Y - w @ Y / w.sum()


def identity_minus(J):
    """1 - J, in J's memory (J is not used again)."""
    J = np.negative(J, out=J)
    J.flat[:: J.shape[0] + 1] += 1.0
    return J


def _correction_batch(mod, sz, T, width, shapes):
    """sum over a batch of paths of J v + O''[w, w] / 2 + G''[v, v] / 2 (:func:`two_layer_propagator`)."""
    def run(nm, pj, q0, V, W, wt, avg):
        F = Flat(mod, shapes, T)

        def observables(one, qv):         # one path's solved-form observables at the order parameters qv
            c = replay_march(mod, (), 1, T, {}, jnp.ones(1), pj, F.unflat(qv), direct=True, width=width,
                             normals={k: x[None] for k, x in one.items()}, sizes=dict(sz), history=False)
            return F.flat(_solved_observables(mod, c, F))

        def solved(qv):                   # the constraints' solutions from the saddle's averages
            return F.flat(constraint_pass(mod, T, pj, F.unflat(qv), avg, sizes=dict(sz), width=width))

        def second(f, x, d):
            return jax.jvp(lambda y: jax.jvp(f, (y,), (d,))[1], (x,), (d,))[1]

        def path(one, v, w):
            jv = jax.jvp(lambda x: observables(one, x), (q0,), (v,))[1]
            return jv + 0.5 * second(lambda x: observables(one, x), q0, w) + 0.5 * second(solved, q0, v)

        return wt @ jax.vmap(path)(nm, V, W)
    return run


SOLVE_KERNELS = "auto"    # "auto": a module's generated Numba solve kernels on the CPU; "numpy": the block solves


def causal_solver(mod, U, T: int, shapes: dict, mode: str | None = None):
    """X = U^-1 B for a time-major U of T steps over the order parameters of layout shapes ``shapes``
    ({name: (1, index dims, T)}), B (T m,) or (T m, k): the module's generated Numba forward
    substitution (:mod:`dmftc.codegen.solve_kernels`) when ``mode`` (default :data:`SOLVE_KERNELS`) is 'auto',
    JAX computes on the CPU, the module has the kernels and U has their pattern (columns reaching later times
    only at ``mod.SOLVE_CROSS``; identity diagonal blocks where ``mod.SOLVE_IDENTITY``); else the NumPy block
    solve (:func:`dmftc.runtime.solvers.linalg.right_solve`).  Returns (solve, 'numba' or 'numpy').  The kernels visit
    only the cross columns: on two_layer at T = 250 (n = 1000), 1250 right-hand sides, 30 ms against 2.1 s."""
    mode = SOLVE_KERNELS if mode is None else mode
    if mode not in ("auto", "numpy"):
        raise ParameterError(f"solve kernels: 'auto' or 'numpy', not {mode!r}")
    U = np.asarray(U, dtype=float)
    n = U.shape[0]
    edges = time_major_edges(n, T)
    kernel = getattr(mod, "causal_forward", None)
    if mode == "auto" and kernel is not None and jax.default_backend() == "cpu":
        m = n // T
        F = Flat(mod, shapes, T)
        cross = np.concatenate([np.arange(a, b) for k, a, b in zip(F.names, F.edges[:-1], F.edges[1:])
                                if k in mod.SOLVE_CROSS] + [np.zeros(0, dtype=np.int64)]).astype(np.int64)
        allowed = np.zeros(m, dtype=bool)
        allowed[cross] = True
        if F.m == m and not np.any(cross_components(U, T) & ~allowed):
            Dinv = np.stack([x for x, _ in block_inverses(U, edges)])
            if not getattr(mod, "SOLVE_IDENTITY", False) or np.all(Dinv == np.eye(m)):
                def solve(B):
                    B = np.asarray(B, dtype=float)
                    X = kernel(U, np.ascontiguousarray(B.reshape(n, -1)), Dinv, cross)
                    return X.reshape(B.shape)
                return solve, "numba"
    factors = factor(U, edges)
    return (lambda B: right_solve(U, edges, B, factors=factors)), "numpy"


def two_layer_mean_correction(mod, normals, pj, sz, T, width, q, U, Y, avg, batch: int = 1024, mesh=None):
    """m1 (T m,) time-major, the O(1/N) correction to the mean, E[q]_N = q* + m1 / N + O(N^-2), from one group
    of paths at its saddle ``q`` (layout), with U = 1 - dF/dq and the paths' centred solved-form observables Y.

    At width N a two-layer network is N independent neurons coupled only through the order parameters, which
    solve q = F_N(q) = G(a_N(q), q): G solves each constraint from the neuron averages a_N(q) = (1/N) sum_i
    Y(xi_i; q) of the single-site observables (each neuron marched with the trajectory q), whose expectation is
    abar(q); q* solves q* = G(abar(q*), q*).  With q = q* + delta, to first order delta = (1/N) sum_i v_i, the
    neuron's direction v_i = U^-1 Y_i (so Sigma = E[v v^T]); at second order only the equal-neuron terms
    survive in the mean:

        m1 = U^-1 ( E_i[ J_i v_i ] + 1/2 E_{i, i'}[ Y''(xi_i')[v_i, v_i] ] + 1/2 E_i[ G_qq[v_i, v_i] ] )

    with J_i v the derivative of neuron i's observables along v, Y''(xi_i') the second derivative of an
    independent neuron's (here the next path's direction, so abar'' contracted with Sigma without forming it)
    and G_qq the second derivative of the constraints' solutions at the fixed averages ``avg``
    (:func:`dmftc.runtime.march.site_march.constraint_pass`).  Forward-mode derivatives of the one-path march
    (nested jvp), in batches of ``batch`` paths: about four marches per path.  The correction assumes the
    spec's process is the network's exact discrete-time dynamics.  tests/test_site_two_layer.py checks it
    against an independent derivation in the spec's own form (dmftc.reference.two_layer_mean_correction);
    tests/test_mean_correction.py against finite-width networks.  ``mesh``: the batches' paths sharded over its
    devices (:mod:`dmftc.runtime.numerics.devices`; None: one device)."""
    S = Y.shape[0]
    solve, _ = causal_solver(mod, U, T, {n: v.shape for n, v in q.items()})     # both solves use this U
    V = solve(Y.T).T
    W = np.roll(V, 1, axis=0)                   # an independent path's direction
    shapes = {n: v.shape for n, v in q.items()}
    batch, batches = equal_batches(S, batch)
    batch = rows_for(batch, mesh)
    F = Flat(mod, shapes, T)
    fn = _compiled(("correction", batch), mod, sz, T, S, width, _correction_batch(mod, sz, T, width, shapes),
                   long_run(S, T, F.m))
    q0 = F.flat(q)
    total = np.zeros(V.shape[1])
    for a, n in batches:
        nm = {k: pad_rows(v[a:a + n], batch) for k, v in normals.items()}
        wt = jnp.asarray(np.arange(batch) < n, dtype=jnp.float64)
        nm, Vb, Wb, wt = place_paths((nm, pad_rows(V[a:a + n], batch), pad_rows(W[a:a + n], batch), wt), mesh)
        total += np.asarray(fn(nm, pj, q0, Vb, Wb, wt, avg))
    return solve(total / S)


def propagate(U, kappa, T: int, half: bool = False):
    """(Sigma = U^-1 kappa U^-T, U's condition number) for a time-major U of T steps
    (:func:`dmftc.runtime.solvers.linalg.sandwich`); ``half``: H with Sigma = H + H^T instead."""
    sigma, info = sandwich(U, kappa, time_major_edges(U.shape[0], T), check_asymmetry=False, half=half)
    return sigma, info["cond"]


def two_layer_propagator(mod, draws, p: dict, sz: dict, T: int, *, correction: bool = False,
                         batch: int | None = None, segments: int | None = None, weights=None) -> dict:
    """The saddle and the propagator of a two-layer module's single-site program on given source draws (module
    doc).  Returns {'q': {name: (*index dims, T)}, 'sigma', 'U', 'kappa': (T m, T m) time-major over the
    components of ``mod.ORDERS`` (m in all), 'condition': U's 1-norm condition number}; with ``correction`` also
    'm1' (T m,): the O(1/N) correction to the mean from these paths.  ``batch``: paths per batch of the tangent
    march (:func:`path_batch`), ``segments`` its causal pieces (:func:`tangent_segments`).  ``weights`` (summing
    to 1): the draws are the nodes of a quadrature rule (:mod:`dmftc.runtime.engines.cubature`) and every average,
    kappa included, is weighted; None: equal-weight samples, kappa with the unbiased 1 / (S - 1)."""
    normals, S, pj, width = _setup(mod, draws, p, sz)
    wts = jnp.full(S, 1.0 / S) if weights is None else jnp.asarray(weights)
    if correction and weights is not None:
        raise ParameterError("the O(1/N) mean correction pairs independent sample paths; it has no weighted form")
    q = group_saddle(mod, normals, wts, pj, sz, T, width)
    J, Y, avg, _ = group_sensitivities(mod, normals, wts, pj, q, sz, T, width, batch, segments=segments)
    U = identity_minus(J)
    Y = centred(Y, wts)
    if weights is None:
        kappa = Y.T @ Y / (S - 1)
    else:
        w = np.asarray(weights)
        kappa = Y.T @ (w[w != 0][:, None] * Y)
    sigma, cond = propagate(U, kappa, T)
    out = {"q": layout_arrays(mod, q, sz, T), "sigma": sigma, "U": U, "kappa": kappa, "condition": cond}
    if correction:
        out["m1"] = two_layer_mean_correction(mod, normals, pj, sz, T, width, q, U, Y, avg)
    return out


def exact_points(mod, p: dict, sz: dict):
    """The source draws of the exact backend: the 2n points +-sqrt(n) e_i of the n standard-normal coordinates,
    mapped through each source group's square-root factor (``draws[k]``, (2n, n_k)), and the factors.  With
    equal weights they average every polynomial of degree <= 3 in the sources exactly: a linear process's
    quadratic observables and their derivatives in the order parameters."""
    factors = source_factors(mod, p, sz)
    n = sum(L.shape[1] for L in factors)
    X = np.sqrt(n) * np.concatenate([np.eye(n), -np.eye(n)])
    draws, off = [], 0
    for L in factors:
        draws.append(X[:, off:off + L.shape[1]] @ L.T)
        off += L.shape[1]
    return draws, factors


def two_layer_exact(mod, p: dict, sz: dict, T: int) -> dict:
    """The saddle and propagator of a linear two-layer spec without sampling (``mod.NONLINEAR`` None): the march
    on :func:`exact_points` gives the exact saddle and dF/dq; kappa from Isserlis, Cov(Y_a, Y_b) = b_a.b_b +
    tr(H_a H_b) / 2, with b and H the gradient and Hessian of one path's solved-form observables in its
    standard-normal coordinates (autodiff of the one-path march, exact for quadratics).  Returns what
    :func:`two_layer_propagator` does, without 'm1'."""
    draws, factors = exact_points(mod, p, sz)
    normals, S, pj, width = _setup(mod, draws, p, sz)
    wts = jnp.full(S, 1.0 / S)
    q = group_saddle(mod, normals, wts, pj, sz, T, width)
    check_finite(layout_arrays(mod, q, sz, T), "saddle-point march")
    J, _, avg, _ = group_sensitivities(mod, normals, wts, pj, q, sz, T, width)
    F = Flat(mod, {n: v.shape for n, v in q.items()}, T)
    n = sum(L.shape[1] for L in factors)

    def one_path(x, pj, q):
        parts, off = [], 0
        for L in factors:
            parts.append(jnp.asarray(L) @ x[off:off + L.shape[1]])
            off += L.shape[1]
        c = replay_march(mod, (), 1, T, {}, jnp.ones(1), pj, q, direct=True, width=width,
                         normals={k: v[None] for k, v in normals_of(mod, [y[None] for y in parts]).items()},
                         sizes=dict(sz), history=False)
        return F.flat(_solved_observables(mod, c, F))

    stats = _compiled("exact kappa", mod, sz, T, S, width, lambda pj, q: (
        jax.jacfwd(one_path)(jnp.zeros(n), pj, q), jax.jacfwd(jax.jacfwd(one_path))(jnp.zeros(n), pj, q)))
    b, H = (np.asarray(a) for a in stats(pj, q))
    kappa = b @ b.T + 0.5 * np.einsum("aij,bji->ab", H, H)
    U = identity_minus(J)
    sigma, cond = propagate(U, kappa, T)
    return {"q": layout_arrays(mod, q, sz, T), "sigma": sigma, "U": U, "kappa": kappa, "condition": cond,
            "layout": q, "avg": avg}


def check_finite(arrays: dict, stage: str):
    """Every trajectory {name: (*dims, T)} finite, or the step where the first one diverged."""
    for name, v in arrays.items():
        v = np.asarray(v)
        bad = ~np.isfinite(v.reshape(-1, v.shape[-1]))
        if bad.any():
            first = int(np.argmax(bad.any(axis=0)))
            raise NumericalError(
                f"{name} became non-finite at step {first} (t = {first} * eta) during the {stage}; "
                "the dynamics diverge: reduce the step size or the feature-learning strength")
