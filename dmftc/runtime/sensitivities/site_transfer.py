"""The Jacobian of a two-layer program's saddle-point map in its driving order parameters by per-path transfer
matrices: the same numbers as the tangent march (:mod:`dmftc.runtime.sensitivities.site_tangents`) in a fraction of its work.

A program whose memory is its sample-scope running sums alone (no histories, kernels, responses or order-scope
sums: every shipped two-layer spec) is, linearised about its paths, a small linear system per path.  With x(t)
the path's running sums (k components) and q(t) the drivers at t (c components),

    x(t + 1) = M_t x(t) + B_t dq(t),     d a(t) = C_t x(t)

for the integrands a of the averages, where M_t = 1 + d increment / dx, B_t = d increment / dq(t) and
C_t = d a / dx come from one step of the program's printed tangents (``site_dfield_*``, ``site_dincrement_*``,
``site_daverage_*``) along k + c directions: the identity on the sums and the one-hot of the drivers at t.  (The
checker admits order parameters in field equations only through causal sums, so the fields and averages at t do
not read q(t).)  So, with Phi(t, s) = M_{t-1} ... M_s,

    d <a(t)> / d q(s) = sum_paths w C_t Phi(t, s + 1) B_s   (s < t, zero from s = t on),

and each readout's row is its constraint's Jacobian in (the averages, q(t)) applied to these: its explicit
dependence on q(t) gives the time-diagonal blocks.  The march is cut into segments of ``segment`` steps, and
with A(t) = Phi(t, start of t's segment),

* within a segment: W(t), whose columns are Phi(t, s + 1) B_s for the segment's earlier steps s, is carried
  forward (W <- M_t W, then B_t as column t), and C_t W(t) gives the segment's own columns of row t;
* across segments: Z(s) = Phi(start, s + 1) B_s of all earlier steps, carried one segment at a time
  (Z <- A(end) Z), and the segment's rows are one matrix product over (paths x k) of the left factors C_t A(t)
  with Z.

Nothing is inverted, so a singular M_t (momentum beta = 0: a velocity's running sum is replaced at every step)
needs no special case.  The k x k products over the paths are broadcast products summed in elementwise loops
(:func:`_bmm`), not XLA's batched dots, which on the CPU run one small product per path.

Work per path: O(T k^2 (k + segment c)) for the factors and W, O(T^2 k^2 c / segment) to carry Z and
2 n_a k c T^2 in matrix products (n_a average components): the tangent march's O(T^2 c) elementwise updates per
field become BLAS products, and everything is jitted JAX over arrays of paths, so it runs unchanged on a GPU.
Agreement with the tangent march on every shipped two-layer spec: tests/test_site_transfer.py; the hand-written
form for ``specs/two_layer.dmft`` it generalises: :mod:`dmftc.reference.transfer_two_layer`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.march.site_eval import Buffers, Evaluator, layer_names, schedule

__all__ = ["SEGMENT", "driver_jacobian", "transfer_applies"]

SEGMENT = 25          # steps per segment (two_layer_sgd, T = 250: 12 or 16 steps ran no faster and compiled longer)


def _bmm(X, Y):
    """X @ Y for batches of small matrices, (paths, i, k) @ (paths, k, j), as k broadcast products added up: one
    elementwise loop (XLA's batched dot on the CPU made the whole Jacobian of two_layer_sgd, k = 4, T = 100,
    1250 paths, three times slower)."""
    out = X[..., :, 0, None] * Y[..., None, 0, :]
    for i in range(1, X.shape[-1]):
        out = out + X[..., :, i, None] * Y[..., None, i, :]
    return out


def transfer_applies(mod) -> bool:
    """True when the program's per-path memory is its sample-scope running sums alone (module doc)."""
    site = getattr(mod, "SITE", None) or {}
    sums = site.get("sums", ())
    return ("axes" in site and bool(sums) and all(scope == "sample" for _, scope in sums)
            and not any(site.get(k) for k in ("history", "kernels", "responses", "terms")))


def driver_jacobian(mod, T: int, wts, p: dict, q: dict, local: dict, *, normals: dict, sizes: dict,
                    width: float = 0.0, avg: dict | None = None, explicit=1.0, segment: int = SEGMENT):
    """({name: (T, 1, index dims, T c)}: d F_name(t) / d (direction j), direction j perturbing the drivers at
    time j // c in their component j % c, as :func:`dmftc.runtime.sensitivities.site_tangents.driver_jacobian` with
    ``per_step = c``.
    ``local``: {driver: (1, index dims, c)}, the one-hot of the c driver components at one step; ``q``,
    ``normals``, ``wts``, ``avg``, ``explicit``: as there (a batch of a group's paths)."""
    site = mod.SITE
    S = int(jnp.shape(wts)[0])
    Bf = Buffers(site, sizes, S, T)
    c = next(iter(local.values())).shape[-1]
    sums = [n for n, _ in site["sums"]]
    k_of = [int(np.prod(Bf.dims[n])) for n in sums]
    k = int(sum(k_of))
    Dp = k + c
    readouts = site["readouts"]
    q1 = {n: jnp.broadcast_to(jnp.asarray(q[n], jnp.float64), Bf.zeros(n).shape) for n, _ in readouts}
    syms = [(qname, sym) for qname, ss in readouts for sym in ss]
    a_of = [int(np.prod(Bf.dims[qname])) for qname, _ in syms]
    na = int(sum(a_of))
    m_of = [int(np.prod(Bf.dims[n])) for n, _ in readouts]
    src = {(n, 1): Bf.source(n, v) for n, v in normals.items()}
    order = [node for node in schedule(site, 1, *layer_names(mod)) if node[0] == "field"]

    eye = np.eye(k, Dp)
    edges = np.cumsum([0] + k_of)
    drs = {(n, 1): jnp.broadcast_to(eye[a:b].reshape((1,) + Bf.dims[n] + (Dp,)), (S,) + Bf.dims[n] + (Dp,))
           for n, a, b in zip(sums, edges[:-1], edges[1:])}
    dq = {n: (jnp.concatenate([jnp.zeros(local[n].shape[:-1] + (k,)), jnp.asarray(local[n], jnp.float64)], -1)
              if n in local else jnp.zeros(Bf.zeros(n).shape[:-1] + (Dp,))) for n in q1}
    # the constraints' directions: one-hot on every average component, then the drivers at t
    vdir = np.eye(na, na + c)
    aedges = np.cumsum([0] + a_of)
    tv = {sym: jnp.asarray(vdir[a:b].reshape((1,) + Bf.dims[qn] + (1, na + c)))
          for (qn, sym), a, b in zip(syms, aedges[:-1], aedges[1:])}
    qdir = {n: (jnp.concatenate([jnp.zeros(local[n].shape[:-1] + (na,)), jnp.asarray(local[n], jnp.float64)], -1)
                if n in local else jnp.zeros(Bf.zeros(n).shape[:-1] + (na + c,))) for n in q1}

    def factors(t, hist, rs):
        """The step's fields and sums, and its factors M - 1 (S, k, k), B (S, k, c), w C (S, n_a, k) and the
        constraints' Jacobians (m, n_a) and (m, c)."""
        hist = dict(hist)
        dhist = {}
        E = Evaluator(mod, 1, T, t, 1, hist, {}, q1, src, p, (), width, {}, sz=sizes, rsums=rs,
                      tangents={"field": dhist, "rsum": drs, "q": dq})
        for _, name, _ in order:
            hist[(name, 1)] = jnp.broadcast_to(getattr(mod, f"site_field_{name}")(E), hist[(name, 1)].shape)
            dhist[(name, 1)] = jnp.broadcast_to(getattr(mod, f"site_dfield_{name}")(E),
                                                (S,) + Bf.dims[name] + (Dp,))
        dinc = jnp.concatenate([jnp.broadcast_to(getattr(mod, f"site_dincrement_{i}")(E),
                                                 (S,) + Bf.dims[n] + (Dp,)).reshape(S, -1, Dp)
                                for i, n in enumerate(sums)], axis=1)                      # (S, k, Dp)
        da = jnp.concatenate([jnp.broadcast_to(getattr(mod, f"site_daverage_{sym}")(E),
                                               (S,) + Bf.dims[qn] + (Dp,)).reshape(S, -1, Dp)[..., :k]
                              for qn, sym in syms], axis=1) * wts[:, None, None]          # (S, n_a, k)
        vals = {sym: (Bf.mean(wts, getattr(mod, f"site_average_{sym}")(E), qn) if avg is None
                      else Bf.col(avg[sym], t)) for qn, sym in syms}
        jv, jq = [], []
        for qname, ss in readouts:
            def solve(v, qq, qname=qname):
                Ej = Evaluator(mod, 1, T, t, 1, hist, {}, qq, src, p, (), width, {}, sz=sizes, rsums=rs)
                return getattr(mod, f"site_constraint_{qname}")(Ej, v)
            mine = {sym: vals[sym] for sym in ss}
            tvq = {sym: tv[sym] for sym in ss}
            tq = {n: explicit * jnp.where(jnp.arange(T)[:, None] == t, qdir[n][..., None, :], 0.0) for n in q1}
            d = jax.vmap(lambda a, b, solve=solve, mine=mine: jax.jvp(solve, (mine, q1), (a, b))[1],
                         in_axes=(-1, -1), out_axes=-1)(tvq, tq)
            d = jnp.broadcast_to(d, (1,) + Bf.dims[qname] + (1, na + c)).reshape(-1, na + c)
            jv.append(d[:, :na])
            jq.append(d[:, na:])
        steps = [getattr(mod, f"site_increment_{i}")(E) for i in range(len(sums))]
        rs = {(n, 1): rs[(n, 1)] + inc for n, inc in zip(sums, steps)}
        return hist, rs, (dinc[..., :k], dinc[..., k:], da, jnp.concatenate(jv), jnp.concatenate(jq))

    def seg_step(carry, t, a0, n):
        """Step t of the segment of n steps from a0.  The carry holds A(t) = Phi(t, a0) and W(t) (S, k, n c), whose
        column s - a0 is Phi(t, s + 1) B_s for the segment's earlier steps s < t (zero from t on).  Out: the left
        factors C_t A(t) (S, n_a, k), row t of the segment's own columns (n_a, n c) and the constraints'
        Jacobians."""
        hist, rs, A, W = carry
        hist, rs, (dM, Bq, Cx, Jv, Jq) = factors(t, hist, rs)
        left = _bmm(Cx, A)
        within = jnp.transpose(Cx, (1, 0, 2)).reshape(na, S * k) @ W.reshape(S * k, n * c)
        A = A + _bmm(dM, A)                                                  # A(t + 1) = M_t A(t)
        onto = (jnp.arange(n * c) == (t - a0) * c + jnp.arange(c)[:, None]).astype(W.dtype)   # (c, n c)
        W = W + _bmm(dM, W) + _bmm(Bq, onto)          # W(t + 1) = M_t W(t), B_t in its column t - a0 (zero so far)
        return (hist, rs, A, W), (left, within, Jv, Jq)

    hist = {(f, 1): Bf.zeros(f, S, current=True) for f in site["fields"]}
    rs = {(n, 1): Bf.zeros(n, S, current=True) for n in sums}
    I = jnp.broadcast_to(jnp.eye(k), (S, k, k))
    m = int(sum(m_of))
    out = []
    Z = jnp.zeros((S, k, 0))
    for a0 in range(0, T, segment):
        a1 = min(T, a0 + segment)
        n = a1 - a0
        (hist, rs, A, W), (left, G, Jv, Jq) = jax.lax.scan(
            lambda cr, t, a0=a0, n=n: seg_step(cr, t, a0, n), (hist, rs, I, jnp.zeros((S, k, n * c))),
            jnp.arange(a0, a1))                                              # G: the segment's own columns
        if a0:                                # the earlier segments' columns: one product over (paths x k)
            L = jnp.transpose(left, (0, 2, 1, 3)).reshape(n * na, S * k)     # rows (t, a), columns (path, k)
            G = jnp.concatenate([(L @ Z.reshape(S * k, a0 * c)).reshape(n, na, a0 * c), G], axis=-1)
        rows = jnp.einsum("tma,taj->tmj", Jv, G)
        rows = rows.at[:, :, a0 * c:].add((jnp.eye(n)[:, None, :, None] * Jq[:, :, None, :]).reshape(n, m, n * c))
        out.append(jnp.pad(rows, ((0, 0), (0, 0), (0, (T - a1) * c))))
        Z = jnp.concatenate([_bmm(A, Z), W], axis=-1)                        # Phi(a1, s + 1) B_s, every s < a1
    rows = jnp.concatenate(out)                                              # (T, m, T c)
    medges = np.cumsum([0] + m_of)
    return {n: rows[:, a:b].reshape((T, 1) + Bf.dims[n] + (T * c,))
            for (n, _), a, b in zip(readouts, medges[:-1], medges[1:])}
