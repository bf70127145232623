"""Errors that dmftc reports to users.

Every error a user can cause is a :class:`DmftcError`.  Spec errors carry a
source location and render as ``file:line:col: error: message``, the offending
line, a caret under the column and an optional hint, in the style of compilers.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pos:
    """A 1-based line/column span in a source file."""

    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None


class DmftcError(Exception):
    """Base class of every error dmftc raises on purpose."""

    exit_code = 1


class SpecError(DmftcError):
    """A problem in a .dmft specification, with its location."""

    kind = "error"

    def __init__(self, message: str, pos: Pos | None = None, *, hint: str | None = None,
                 source: str | None = None, filename: str = "<spec>"):
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.hint = hint
        self.source = source
        self.filename = filename

    def located(self, source: str, filename: str) -> "SpecError":
        """Attach the source text and file name (used when the error is raised deep inside)."""
        if self.source is None:
            self.source = source
        if self.filename == "<spec>":
            self.filename = filename
        return self

    def render(self) -> str:
        if self.pos is None:
            head = f"{self.filename}: error: {self.message}"
            return head + (f"\n  hint: {self.hint}" if self.hint else "")
        head = f"{self.filename}:{self.pos.line}:{self.pos.col}: error: {self.message}"
        lines = [head]
        if self.source is not None:
            src_lines = self.source.splitlines()
            if 1 <= self.pos.line <= len(src_lines):
                text = src_lines[self.pos.line - 1].expandtabs(1)
                width = 1
                if self.pos.end_line == self.pos.line and self.pos.end_col:
                    width = max(1, self.pos.end_col - self.pos.col)
                gutter = f"{self.pos.line:>5} | "
                lines.append(gutter + text)
                lines.append(" " * (len(gutter) + self.pos.col - 1) + "^" + "~" * (width - 1))
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def __str__(self) -> str:  # pragma: no cover - exercised through render
        return self.render()


class SyntaxSpecError(SpecError):
    """The text does not follow the grammar."""


class NameSpecError(SpecError):
    """An undefined, misspelled or duplicated name."""


class CausalitySpecError(SpecError):
    """An integral in a field equation that is not strictly causal."""


class ShapeSpecError(SpecError):
    """Wrong number of indices or arguments."""


class StructureSpecError(SpecError):
    """The action or process does not have the structure dmftc can derive."""


class ParameterError(DmftcError):
    """A bad argument to ``solve`` (unknown name, wrong shape, invalid value)."""

    exit_code = 2


class NumericalError(DmftcError):
    """A numerical failure: non-finite values, singular systems, divergence."""

    exit_code = 3


class PropagatorTooLarge(DmftcError):
    """A requested propagator block does not fit the memory budget."""

    exit_code = 3
