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
import subprocess
import warnings
from pathlib import Path

from dmftc.cli import main

ROOT = Path(__file__).resolve().parent.parent


def exit_status(stop: SystemExit, stream) -> int:
    """The interpreter's exit status for ``stop`` (None 0, an integer itself, anything else 1 with it printed to
    ``stream``, as ``sys.exit(message)`` prints to stderr)."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=stream)
    return 1


def dmftc(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            code = main([str(a) for a in args])
        except SystemExit as stop:
            code = exit_status(stop, err)
    for w in caught:
        err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    return subprocess.CompletedProcess(["dmftc", *map(str, args)], code, out.getvalue(), err.getvalue())
