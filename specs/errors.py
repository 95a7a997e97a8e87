"""One error type for bad input: it names the file, the field and the reason (one line, exit 2)."""
from __future__ import annotations


class SpecError(Exception):
    """Bad input: `file`, `field` and `reason` make the one line the CLI prints."""

    def __init__(self, file: str | None, field: str | None, reason: str):
        self.file, self.field, self.reason = file, field, reason
        super().__init__(self.line())

    def line(self) -> str:
        """The one line shown to the user: 'file: field: reason'."""
        parts = [p for p in (self.file, self.field) if p]
        return ": ".join(parts + [self.reason])


def from_validation(file: str | None, err) -> SpecError:
    """Turn a pydantic ValidationError into a SpecError naming its first failing field."""
    first = err.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or None
    msg = first.get("msg", "invalid value")
    value = first.get("input")
    if first.get("type") not in ("missing",) and value is not None and not isinstance(value, (dict, list)):
        msg = f"{msg} (got {value!r})"
    extra = len(err.errors()) - 1
    if extra:
        msg += f" (and {extra} more)"
    return SpecError(file, field, msg)
