"""The command line run in the test process: ``dmftc(*args)`` returns what ``python -m dmftc.cli *args`` would,
as a CompletedProcess (return code, stdout, stderr), without starting an interpreter and importing JAX again.

It calls :func:`dmftc.cli.main` with the arguments, in ``cwd``, with stdout and stderr captured; a SystemExit
(argparse's usage errors) gives its code, and warnings are written to the captured stderr as the interpreter
would print them.  An exception that escapes ``main`` is not caught: it fails the calling test, as a traceback on
stderr fails the tests that run the real entry point (tests/test_cli.py keeps some that do).
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import warnings
from pathlib import Path

from dmftc.cli import main

ROOT = Path(__file__).resolve().parent.parent


def dmftc(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                code = main([str(a) for a in args])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                if not isinstance(stop.code, (int, type(None))):
                    print(stop.code, file=err)
    finally:
        os.chdir(here)
    for w in caught:
        err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    return subprocess.CompletedProcess(["dmftc", *map(str, args)], code, out.getvalue(), err.getvalue())
