"""A layer's Hessian held as its parts (dmftc.runtime.solvers.local_hessian) gives every block of the dense matrix
the estimator used to build, to the bit."""
import numpy as np

from dmftc.runtime.solvers.local_hessian import LocalHessian, local_block


def _parts(rng, nv=40, m=17, k=9, nsparse=30):
    cols = rng.choice(nv, m, replace=False)
    pos = rng.choice(nv, k, replace=False)                      # overlaps cols in general
    si, sj = rng.integers(0, nv, nsparse), rng.integers(0, nv, nsparse)
    si[:3], sj[:3] = si[0], sj[0]                                # repeated pairs add
    return LocalHessian(nv, cols, rng.normal(size=(m, m)), rng.normal(size=(nv, m)), si, sj,
                        rng.normal(size=nsparse), pos, rng.normal(size=(k, nv)))


def _dense_by_hand(h: LocalHessian):
    """The dense matrix built the way the estimator built it before it kept the parts."""
    d = np.zeros((h.nv, h.nv))
    d[np.ix_(h.cols, h.cols)] = h.HRR
    d[:, h.cols] += h.B
    d[h.cols, :] += h.B.T
    np.add.at(d, (h.si, h.sj), h.sv)
    d[h.pos] += h.P
    d[:, h.pos] += h.P.T
    return d


def test_blocks_equal_the_dense_matrix_to_the_bit():
    rng = np.random.default_rng(7)
    for _ in range(5):
        h = _parts(rng)
        full = _dense_by_hand(h)
        assert np.array_equal(h.dense(), full)
        a = rng.choice(h.nv, 23, replace=False)
        b = rng.choice(h.nv, 11, replace=False)
        assert np.array_equal(h.block(a, b), full[np.ix_(a, b)])
        assert np.array_equal(local_block(h, a, b), local_block(full, a, b))
        assert h.finite()
    h.B[2, 1] = np.inf
    assert not h.finite()


def test_repeated_columns_are_refused():
    rng = np.random.default_rng(1)
    h = _parts(rng)
    try:
        LocalHessian(h.nv, np.r_[h.cols[:-1], h.cols[0]], h.HRR, h.B, h.si, h.sj, h.sv, h.pos, h.P)
    except AssertionError as e:
        assert "distinct" in str(e)
    else:
        raise AssertionError("a repeated column was accepted")


def test_pooled_blocks_are_the_dense_sums_to_the_bit():
    """The solve-bias pool keeps U's running sum sparse: its mean equals the dense mean entry for entry."""
    from types import SimpleNamespace

    from dmftc.runtime.solvers.solve_bias import Pool

    rng = np.random.default_rng(3)
    n, groups = 30, 3
    Us = [np.tril(rng.normal(size=(n, n)) * (rng.random((n, n)) < 0.3)) for _ in range(groups)]
    Ks = [rng.normal(size=(n, n)) for _ in range(groups)]
    pool = Pool()
    for U, K in zip(Us, Ks):
        pool.add(SimpleNamespace(blocks=SimpleNamespace(U=U, Kd=K, order=None, primal_block_max=0.0)))
    dense_U, dense_K = Us[0].copy(), Ks[0].copy()
    for U, K in zip(Us[1:], Ks[1:]):
        dense_U += U
        dense_K += K
    mean = pool.mean_blocks()
    assert np.array_equal(mean.U, dense_U / groups)
    assert np.array_equal(mean.Kd, dense_K / groups)
