"""W H W^T, the log-weights' second derivatives along the outputs' rows, from per-path quantities
(:mod:`dmftc.runtime.adjoint`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dmftc.runtime.adjoint.sweep import Program

__all__ = ["source_moves", "response_part", "loop_part", "second_order_part"]


def source_moves(prog: Program, W: dict, X: dict) -> dict:
    """v_c: {(source x, l): (R, S, T)}: the move of source x[l] at s that output c's response duals make,
    sum over responses R = <dY / dx> of layer l and over t of W_c(R[l](t, s)) Y[l](t) (per path)."""
    out = {}
    for name, x in prog.responses.items():
        for l in range(1, prog.L + 1):
            v = jnp.einsum("cts,pt->cps", W[("row", name, l)], X[(name, l)])
            out[(x, l)] = out[(x, l)] + v if (x, l) in out else v
    return out


def response_part(prog: Program, xi: dict, wts, W: dict, hold: dict, moves: dict):
    """A (R, R) with A[c, d] = < D_{v_c} V_d >: the forward-mode derivative of the averages at fixed order
    parameters along each output's source move, contracted with W."""
    zero = {k: jnp.zeros_like(v[0]) for k, v in moves.items()}

    def averages(dsrc):
        return prog.measured(prog.march(xi, wts, hold=hold, dsrc=dsrc))

    def row(move):
        tangent = jax.jvp(averages, (zero,), (move,))[1]
        return sum(jnp.tensordot(W[k], tangent[k], axes=tangent[k].ndim) for k in tangent)

    return jax.vmap(row)(moves)


def loop_part(prog: Program, W: dict, Gamma: dict, wts):
    """L (R, R) with L[c, d] = < tr(P_c Gamma P_d Gamma) >, per layer: P_c maps the responses' observables
    Y[l](t) to their sources x[l](s) with W_c's response entries, Gamma[(name, x', l)] (S, T, T) the paths'
    tangents dY_name[l](t) / dx'[l](s')."""
    total = 0.0
    src = prog.sources
    for l in range(1, prog.L + 1):
        # M_c[p, x, s, x', s'] = sum over responses of x, sum_t W_c(t, s) Gamma_name,x'(p, t, s')
        blocks = []
        for x in src:
            names = [n for n, y in prog.responses.items() if y == x]
            blocks.append(jnp.stack([sum(jnp.einsum("cts,ptu->cpsu", W[("row", n, l)], Gamma[(n, xp, l)])
                                         for n in names) for xp in src], axis=3))          # (R, S, s, x', s')
        M = jnp.stack(blocks, axis=2)                                                     # (R, S, x, s, x', s')
        R, S, nx, T = M.shape[0], M.shape[1], M.shape[2], M.shape[3]
        M = M.reshape(R, S, nx * T, nx * T)
        Mt = jnp.swapaxes(M, 2, 3) * wts[None, :, None, None]
        total = total + jnp.einsum("cpij,dpij->cd", M, Mt)
    return total


def second_order_part(prog: Program, xi: dict, wts, W: dict, state: dict):
    """W H W^T (R, R), symmetric: the response part and its transpose plus the loops."""
    rec = prog.march(xi, wts, hold=state, record=True)
    moves = source_moves(prog, W, rec["X"])
    A = response_part(prog, xi, wts, W, state, moves)
    return A + A.T + loop_part(prog, W, rec["Gamma"], wts)
