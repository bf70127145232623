"""Atomic writes of results files: a temporary file in the target's directory, renamed over the target."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_output"]


def atomic_output(path, suffix: str, write) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path`` (creating its directory) and rename it to
    ``path``; the temporary file is removed if ``write`` fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
