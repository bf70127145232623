"""Test-session setup shared by every test module, the xdist workers and the experiment scripts the tests start.

* One JAX persistent compilation cache for the session.  Most of the default suite's time is XLA compilation of
  the same jitted kernels (the single-site march, the propagator's per-path sums) in several processes: each
  xdist worker and each ``experiments/*.py --quick`` subprocess compiles them again.  The cache lets a process
  load an executable another one has compiled (keyed by the program, its shapes, the backend and the JAX
  version, so a stale entry is never used).  It lives in ``.pytest_cache/jax`` (git-ignored; delete it to
  measure a cold run) unless ``JAX_COMPILATION_CACHE_DIR`` is set.  It changes no result.
* XLA compiled without LLVM's expensive optimisation passes (``XLA_FLAGS``, unless already set): the suite's
  programs are small and run once or twice, so compiling them is most of its time; LLVM's optimisation level
  changes the machine code's speed, not its arithmetic (no fast-math either way), and the tests' numbers are
  the same.  Measured on ``tests/test_deep_propagator.py``: 26% less CPU time.  XLA's CPU fusion emitters are off
  as well (``--xla_cpu_use_fusion_emitters=false``: the former loop emitters, which compile faster; 21% to 26% less
  CPU time measured on a compile-bound test and on small solves; results equal to round-off, 7e-13 relative).
  Users' runs keep XLA's defaults.  Programs that run long against their compilation ask for XLA's default
  optimisation whatever these flags say (:func:`dmftc.jax_setup.long_run_options`: the validation ensembles'
  training loops, the deep propagator's per-path sums over many paths of a long system), because the lowered
  level doubles their run time.
* One thread per xdist worker (XLA's intra-op pool and the BLAS of NumPy and SciPy), set only in workers: the
  workers already fill the cores, and each one's threads would compete with the others'.
* Compiled programs in memory: a worker runs hundreds of tests in one process and JAX keeps every program it
  compiled; on the CPU each holds memory mappings, and past Linux's ``vm.max_map_count`` the next compilation (or
  cache write) segfaults (``dmftc/jax_setup.py``).  After each test, :func:`dmftc.jax_setup.make_room` drops them
  when the worker holds over half the limit (tests also call runtime internals that bypass a solve's own check).
"""
import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
_WORKER = "PYTEST_XDIST_WORKER" in os.environ      # one of several test processes sharing the cores
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false" +
                      (" --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" if _WORKER else ""))
if _WORKER:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):     # the subprocesses'
        os.environ.setdefault(_var, "1")
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)                                 # this process's, whether or not NumPy is loaded yet

from dmftc.jax_setup import fewer_collections, make_room  # noqa: E402  (importing dmftc applies the settings above)

fewer_collections()              # the garbage collector's passes took 20-40% of tracing (dmftc.jax_setup.GC_THRESHOLD)


@pytest.fixture(autouse=True)
def _room_for_compiled_programs():
    yield
    make_room()
