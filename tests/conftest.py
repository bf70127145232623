"""Test-session setup shared by every test module, the xdist workers and the experiment scripts the tests start.

Most of the default suite's time is XLA compilation of the same jitted kernels (the single-site march, the
propagator's per-path sums) in several processes: each xdist worker and each ``experiments/*.py --quick``
subprocess compiles them again.  JAX's persistent compilation cache lets a process load an executable another
one has compiled (keyed by the program, its shapes, the backend and the JAX version, so a stale entry is never
used).  The cache lives in ``.pytest_cache/jax`` (git-ignored; delete it to measure a cold run) unless
``JAX_COMPILATION_CACHE_DIR`` is set.  It changes no result, only when compilation happens.
"""
import os
from pathlib import Path

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
