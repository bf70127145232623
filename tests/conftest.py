"""Test-session setup shared by every test module, the xdist workers and the experiment scripts the tests start.

Most of the default suite's time is XLA compilation of the same jitted kernels in several processes (each xdist
worker and each ``experiments/*.py --quick`` subprocess compiles them again).  JAX's persistent compilation
cache would let a process load what another one compiled, but it is off by default (``dmftc/jax_setup.py``: with
jaxlib 0.10.2 on the CPU, writing an entry segfaulted a CI worker now and then).  A developer who accepts that
risk for a faster warm rerun sets ``DMFTC_JAX_CACHE=1``; the suite then keeps its cache in ``.pytest_cache/dmftc``
(git-ignored; delete it to measure a cold run) unless ``DMFTC_CACHE_DIR`` or ``JAX_COMPILATION_CACHE_DIR`` says
otherwise.  The cache changes no result, only when compilation happens.
"""
import os
from pathlib import Path

os.environ.setdefault("DMFTC_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "dmftc"))
