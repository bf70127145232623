"""Run a benchmark case in a fresh Python process with a chosen checkout of dmftc.

A case's code is given to ``python -c``, which puts the working directory first on ``sys.path``: run from a
checkout's root, every case would import THAT checkout, whatever ``PYTHONPATH`` says (the ``--against`` ratios
measured that way before 2026-11-29 compared a checkout with itself).  So each case runs in a scratch directory
with the checkout to time first on ``PYTHONPATH`` (default: the one this script belongs to), and reports which
dmftc it imported; a mismatch is an error, not a silent ratio of 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_PRELUDE = "import dmftc as _d, sys as _s; print('DMFTC_FROM', _d.__file__, file=_s.stderr)\n"


def run_case(code: str, checkout: str | None = None) -> dict:
    """The JSON object the case prints last, or {'error': ...}; ``checkout``: a dmftc checkout's root."""
    root = Path(checkout or HERE).resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run([sys.executable, "-c", _PRELUDE + code], capture_output=True, text=True, env=env,
                              cwd=scratch)
    where = [ln.split(" ", 1)[1] for ln in proc.stderr.splitlines() if ln.startswith("DMFTC_FROM ")]
    if where and not Path(where[0]).resolve().is_relative_to(root):
        return {"error": f"imported dmftc from {where[0]}, not from {root}"}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
