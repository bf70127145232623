"""The generated Numba kernels of a two-layer module: the causal linear solves with its U.

U = 1 - dF/dq over the order parameters, time-major (T steps, m components per time), is block lower
triangular in time, and the derivation knows more of its pattern: its columns reach later times only at the
order parameters the fields and running sums read (the program's drivers, ``SOLVE_CROSS``), and a diagonal block
is the identity unless a constraint reads another order parameter at its own time (``SOLVE_SAME_TIME``).  The
kernels are forward substitution (U X = B) and back substitution (U^T Y = E, i.e. Y^T U = E^T) by times that
visit only the cross columns below the diagonal blocks: O(n T c k) for k right-hand sides, c cross components
per time, against the n^2 k of a dense triangular solve.  With identity diagonal blocks the kernels skip them
(the specialised variant); otherwise they apply the blocks' inverses, which the runtime computes (and checks)
once.  ``cache=SOLVE_CACHE`` (true for a module file imported by :func:`dmftc.load`): Numba compiles each kernel
once per module file and reuses it across processes.
The runtime (:mod:`dmftc.runtime.engines.site_engine`) checks that a U has the pattern before calling them.
"""
from __future__ import annotations

import sympy as sp

__all__ = ["emit_solve_kernels", "same_time_reads"]


def same_time_reads(prog, scalars: tuple) -> tuple:
    """((order parameter, (the order parameters its constraint's solution reads at its own time, ...)), ...), only
    those that read some: the off-diagonal entries of U's diagonal blocks."""
    out = []
    for name, coeff, rest, _ in prog.readouts:
        free = {str(s.base.label) if isinstance(s, sp.Indexed) else str(s)
                for s in (sp.sympify(rest) / sp.sympify(coeff)).atoms(sp.Symbol, sp.Indexed)}
        reads = tuple(n for n in scalars if n in free and n != name)
        if reads:
            out.append((name, reads))
    return tuple(out)


_BLOCK = {
    True: "        X[t * m:(t + 1) * m, :] = r                  # identity diagonal block\n",
    False: ("        for i in range(m):                           # the diagonal block's inverse\n"
            "            for j in range(k):\n"
            "                acc = 0.0\n"
            "                for l in range(m):\n"
            "                    acc += Dinv[t, i, l] * r[l, j]\n"
            "                X[t * m + i, j] = acc\n"),
}

_BACK_BLOCK = {
    True: "        Y[s * m:(s + 1) * m, :] = r                  # identity diagonal block\n",
    False: ("        for i in range(m):                           # the diagonal block's inverse, transposed\n"
            "            for j in range(k):\n"
            "                acc = 0.0\n"
            "                for l in range(m):\n"
            "                    acc += Dinv[s, l, i] * r[l, j]\n"
            "                Y[s * m + i, j] = acc\n"),
}


def emit_solve_kernels(w, *, cross: tuple, same_time: tuple) -> None:
    """Append the solve kernels' pattern constants and ``@numba.njit`` functions (``w`` writes text)."""
    identity = not same_time
    w("\n# ---------------------------------------------------------------- the causal solves (Numba)\n"
      "# U = 1 - dF/dq, time-major (T steps, m components per time), block lower triangular in time: its columns\n"
      "# reach later times only at the components of SOLVE_CROSS (the drivers); SOLVE_SAME_TIME: the order\n"
      "# parameters each constraint reads at its own time (none: U's diagonal blocks are the identity and the\n"
      "# kernels skip them).  dmftc.codegen.solve_kernels; called by dmftc.runtime.engines.site_engine on the CPU.\n")
    w(f"SOLVE_CROSS = {tuple(cross)!r}\nSOLVE_SAME_TIME = {tuple(same_time)!r}\nSOLVE_IDENTITY = {identity!r}\n")
    w("# Numba caches the kernels' machine code beside the module file when dmftc.load imported it (one module name\n"
      "# per file: a cache written under another name would not load); otherwise it compiles them in memory\n"
      "SOLVE_CACHE = (str(globals().get('__name__', '')).startswith('dmftc_generated_')\n"
      "               and not str(globals().get('__file__') or '<').startswith('<'))\n\n")
    w("\n@numba.njit(cache=SOLVE_CACHE)\n"
      "def causal_forward(U, B, Dinv, cross):\n"
      "    \"\"\"X with U X = B by forward substitution over times: U (T m, T m), B (T m, k), Dinv (T, m, m) the\n"
      "    inverses of U's diagonal blocks" + (" (unused: they are the identity)" if identity else "") +
      ", cross the offsets within a time of the\n"
      "    components whose columns reach later times (the only ones read below the diagonal blocks).\"\"\"\n"
      "    T, m = Dinv.shape[0], Dinv.shape[1]\n"
      "    k = B.shape[1]\n"
      "    X = np.zeros_like(B)\n"
      "    r = np.empty((m, k))\n"
      "    for t in range(T):\n"
      "        for i in range(m):\n"
      "            row = t * m + i\n"
      "            for j in range(k):\n"
      "                r[i, j] = B[row, j]\n"
      "            for s in range(t):\n"
      "                for c in cross:\n"
      "                    a = U[row, s * m + c]\n"
      "                    if a != 0.0:\n"
      "                        for j in range(k):\n"
      "                            r[i, j] -= a * X[s * m + c, j]\n" + _BLOCK[identity] +
      "    return X\n\n")
    w("\n@numba.njit(cache=SOLVE_CACHE)\n"
      "def causal_back(U, E, Dinv, cross):\n"
      "    \"\"\"Y with U^T Y = E (the rows Y^T with Y^T U = E^T) by back substitution over times from the last: E, Y\n"
      "    (T m, k); U, Dinv and cross as for causal_forward.\"\"\"\n"
      "    T, m = Dinv.shape[0], Dinv.shape[1]\n"
      "    k = E.shape[1]\n"
      "    Y = np.zeros_like(E)\n"
      "    r = np.empty((m, k))\n"
      "    for s in range(T - 1, -1, -1):\n"
      "        for i in range(m):\n"
      "            for j in range(k):\n"
      "                r[i, j] = E[s * m + i, j]\n"
      "        for c in cross:\n"
      "            col = s * m + c\n"
      "            for row in range((s + 1) * m, T * m):\n"
      "                a = U[row, col]\n"
      "                if a != 0.0:\n"
      "                    for j in range(k):\n"
      "                        r[c, j] -= a * Y[row, j]\n" + _BACK_BLOCK[identity] +
      "    return Y\n\n")



_GAUSS_JORDAN = (
    "\n@numba.njit(cache=SOLVE_CACHE)\n"
    "def block_inverse(D):\n"
    "    \"\"\"(D^-1, ||D||_1 ||D^-1||_1) of one diagonal block by Gauss-Jordan elimination with partial pivoting;\n"
    "    (partial result, inf) when a pivot vanishes or the condition number is not finite.\"\"\"\n"
    "    m = D.shape[0]\n"
    "    A = D.copy()\n"
    "    inv = np.eye(m)\n"
    "    norm = 0.0\n"
    "    for j in range(m):\n"
    "        s = 0.0\n"
    "        for i in range(m):\n"
    "            s += abs(D[i, j])\n"
    "        norm = max(norm, s)\n"
    "    for j in range(m):\n"
    "        p = j                                            # the pivot: the largest entry of column j from row j\n"
    "        big = abs(A[j, j])\n"
    "        for i in range(j + 1, m):\n"
    "            if abs(A[i, j]) > big:\n"
    "                big = abs(A[i, j])\n"
    "                p = i\n"
    "        if not big > 0.0:                                # zero or NaN: singular\n"
    "            return inv, np.inf\n"
    "        if p != j:\n"
    "            for l in range(m):\n"
    "                A[j, l], A[p, l] = A[p, l], A[j, l]\n"
    "                inv[j, l], inv[p, l] = inv[p, l], inv[j, l]\n"
    "        r = 1.0 / A[j, j]\n"
    "        for l in range(m):\n"
    "            A[j, l] *= r\n"
    "            inv[j, l] *= r\n"
    "        for i in range(m):\n"
    "            f = A[i, j]\n"
    "            if i != j and f != 0.0:\n"
    "                for l in range(m):\n"
    "                    A[i, l] -= f * A[j, l]\n"
    "                    inv[i, l] -= f * inv[j, l]\n"
    "    ninv = 0.0\n"
    "    for j in range(m):\n"
    "        s = 0.0\n"
    "        for i in range(m):\n"
    "            s += abs(inv[i, j])\n"
    "        ninv = max(ninv, s)\n"
    "    cond = norm * ninv\n"
    "    return inv, (cond if cond < np.inf else np.inf)\n\n")


_BLOCK_STEP = (                  # a time step of either substitution: its diagonal block's inverse and condition
    "        lo, hi = edges[b], edges[b + 1]\n"
    "        m = hi - lo\n"
    "        inv, c = block_inverse(U[lo:hi, lo:hi])\n"
    "        cond[b] = c\n"
    "        if not c < np.inf:\n"
    "            break\n")


def emit_block_kernels(w) -> None:
    """Append a deep module's causal solve kernels (``@numba.njit``, plain loops: they compile in a few seconds,
    where NumPy's matrix product inside Numba costs several more): block back and forward substitution with a U
    whose diagonal blocks have the sizes the action's causal order gives (``edges``), and each diagonal block's
    exact 1-norm condition number (``w`` writes text)."""
    w("\n# ---------------------------------------------------------------- the causal solves (Numba)\n"
      "# U (dual x primal block of the action Hessian, in causal order: dmftc.runtime.solvers.causal_solve) is block lower\n"
      "# triangular in time, with diagonal blocks at edges (T + 1 offsets) that grow with time: at time tau the\n"
      "# kernels, responses and error signal first acting at tau.  Below the diagonal every later row of U reaches\n"
      "# every block (the local Hessians of ln Z_l couple all earlier times), so the kernels skip only U's zero\n"
      "# entries there; they invert each diagonal block once (its exact 1-norm condition number is returned for the\n"
      "# runtime's check).  dmftc.codegen.solve_kernels; called by dmftc.runtime.solvers.causal_solve on the CPU.\n")
    w("SOLVE_BLOCKS = 'time'\n")
    w("# Numba caches the kernels' machine code beside the module file when dmftc.load imported it (one module name\n"
      "# per file: a cache written under another name would not load); otherwise it compiles them in memory\n"
      "SOLVE_CACHE = (str(globals().get('__name__', '')).startswith('dmftc_generated_')\n"
      "               and not str(globals().get('__file__') or '<').startswith('<'))\n\n")
    w(_GAUSS_JORDAN)
    w("\n@numba.njit(cache=SOLVE_CACHE)\n"
      "def block_back(U, E, edges):\n"
      "    \"\"\"(Y, cond) with Y U = E by block back substitution from the last time: U (n, n) block lower triangular\n"
      "    with diagonal blocks at edges, E (R, n); cond (T,) the diagonal blocks' 1-norm condition numbers (the\n"
      "    substitution stops at the first singular block, whose cond is inf).\"\"\"\n"
      "    T = edges.shape[0] - 1\n"
      "    n = U.shape[0]\n"
      "    R = E.shape[0]\n"
      "    YT = np.zeros((n, R))                                # Y^T: a row of it is contiguous over the R rows\n"
      "    cond = np.zeros(T)\n"
      "    for b in range(T - 1, -1, -1):\n"
      + _BLOCK_STEP +
      "        rhs = np.empty((m, R))                           # E's block minus the later times' rows through U\n"
      "        for i in range(m):\n"
      "            for r in range(R):\n"
      "                rhs[i, r] = E[r, lo + i]\n"
      "        for row in range(hi, n):\n"
      "            for i in range(m):\n"
      "                a = U[row, lo + i]\n"
      "                if a != 0.0:\n"
      "                    for r in range(R):\n"
      "                        rhs[i, r] -= a * YT[row, r]\n"
      "        for i in range(m):                               # times the block's inverse, transposed\n"
      "            for r in range(R):\n"
      "                YT[lo + i, r] = 0.0\n"
      "            for l in range(m):\n"
      "                a = inv[l, i]\n"
      "                if a != 0.0:\n"
      "                    for r in range(R):\n"
      "                        YT[lo + i, r] += a * rhs[l, r]\n"
      "    return YT.T.copy(), cond\n\n")
    w("\n@numba.njit(cache=SOLVE_CACHE)\n"
      "def block_forward(U, B, edges):\n"
      "    \"\"\"(X, cond) with U X = B by block forward substitution from the first time: B (n, k); U, edges and cond\n"
      "    as for block_back.\"\"\"\n"
      "    T = edges.shape[0] - 1\n"
      "    k = B.shape[1]\n"
      "    X = np.zeros(B.shape)\n"
      "    cond = np.zeros(T)\n"
      "    for b in range(T):\n"
      + _BLOCK_STEP +
      "        rhs = np.empty((m, k))                           # B's block minus the earlier times through U\n"
      "        for i in range(m):\n"
      "            for j in range(k):\n"
      "                rhs[i, j] = B[lo + i, j]\n"
      "            for s in range(lo):\n"
      "                a = U[lo + i, s]\n"
      "                if a != 0.0:\n"
      "                    for j in range(k):\n"
      "                        rhs[i, j] -= a * X[s, j]\n"
      "        for i in range(m):                               # times the block's inverse\n"
      "            for l in range(m):\n"
      "                a = inv[i, l]\n"
      "                if a != 0.0:\n"
      "                    for j in range(k):\n"
      "                        X[lo + i, j] += a * rhs[l, j]\n"
      "    return X, cond\n\n")
