"""Results store: an append-only CSV of measurements (time, git commit, machine, case, metric, value).

Nothing is ever overwritten. An append takes an exclusive lock (`<file>.lock`, fcntl) and then
either writes its lines with one `write` on an O_APPEND descriptor (the header already has every
column), or, when a row brings a column the file does not have yet, rewrites the whole file into a
temporary sibling with the wider header (old rows keep their values, new cells empty) and renames
it over the original. Either way a reader sees the old file or the new one, never half a row, and
an interrupted append leaves the previous content intact.
"""
from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import os
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Mapping

from specs.errors import SpecError
from specs.loaders import write_atomic

BASE_COLUMNS = ("time", "commit", "machine", "case", "metric", "value")
ENV_PATH = "MOE_OFFLOAD_RESULTS"


def default_store_path() -> Path:
    """`$MOE_OFFLOAD_RESULTS`, else runs/results.csv under the current directory."""
    env = os.environ.get(ENV_PATH)
    return Path(env) if env else Path("runs") / "results.csv"


def machine_id() -> str:
    """A stable id of this machine: hostname plus a short hash of /etc/machine-id when readable."""
    host = socket.gethostname() or "unknown"
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            mid = Path(p).read_text().strip()
        except OSError:
            continue
        if mid:
            return f"{host}-{hashlib.sha256(mid.encode()).hexdigest()[:8]}"
    return host


_COMMIT: str | None = None


def git_commit() -> str:
    """The commit of the checkout this code runs from ('+dirty' when it has local changes)."""
    global _COMMIT
    if _COMMIT is None:
        here = Path(__file__).resolve().parent
        try:
            sha = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
                                 capture_output=True, text=True, timeout=5)
            if sha.returncode != 0:
                raise OSError(sha.stderr)
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "-uno"],
                                   capture_output=True, text=True, timeout=5)
            _COMMIT = sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):
            _COMMIT = "unknown"
    return _COMMIT


def now_iso() -> str:
    """UTC time of a measurement, ISO 8601 to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def make_row(case: str, metric: str, value: float, **extra: Any) -> dict[str, Any]:
    """A store row stamped with time, commit and machine; `extra` become further columns."""
    row: dict[str, Any] = {"time": now_iso(), "commit": git_commit(), "machine": machine_id(),
                           "case": case, "metric": metric, "value": value}
    for k, v in extra.items():
        if k in BASE_COLUMNS:
            raise ValueError(f"extra column {k!r} shadows a base column")
        row[k] = v
    return row


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _header(path: Path) -> list[str] | None:
    """The store's columns (None: no store yet, or an empty file); a SpecError when `path` is not a store,
    so that an append never rewrites some other file as one."""
    try:
        with open(path, newline="") as f:
            first = f.readline()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise SpecError(str(path), None, "not a results store (not UTF-8 text)") from None
    except IsADirectoryError:
        raise SpecError(str(path), None, "is a folder, not a results store") from None
    if not first.strip():
        return None
    cols = next(csv.reader([first]))
    if not set(BASE_COLUMNS) <= set(cols):
        raise SpecError(str(path), "header", f"not a results store (its first line lacks {', '.join(BASE_COLUMNS)})")
    return cols


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(float(v))
    return str(v)


def _lines(columns: list[str], rows: Iterable[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for r in rows:
        w.writerow([_fmt(r.get(c)) for c in columns])
    return buf.getvalue()


def append_rows(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> int:
    """Append `rows` (dicts with at least the base columns) to the store; returns rows written."""
    path = Path(path)
    rows = [dict(r) for r in rows]
    if not rows:
        return 0
    for r in rows:
        missing = [c for c in BASE_COLUMNS if c not in r]
        if missing:
            raise ValueError(f"row lacks column(s) {missing}")
    with _locked(path):
        header = _header(path)
        cols = list(header) if header else list(BASE_COLUMNS)
        new = [k for r in rows for k in r if k not in cols]
        new = list(dict.fromkeys(new))
        if header is not None and not new:
            data = _lines(cols, rows).encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                view = memoryview(data)
                while view:  # one write on O_APPEND (a regular file takes it whole); loop if short
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            return len(rows)
        cols += new
        old = read_rows(path) if header is not None else []
        text = _lines(cols, [dict(zip(cols, cols))]) + _lines(cols, old) + _lines(cols, rows)
        write_atomic(path, text)
        return len(rows)


def append(path: str | os.PathLike, case: str, metric: str, value: float, **extra: Any) -> None:
    """Append one measurement (stamped with time, commit and machine)."""
    append_rows(path, [make_row(case, metric, value, **extra)])


def check_store(path: str | os.PathLike) -> None:
    """A SpecError naming `path` unless it is a results store: a file, empty or headed as a store (its rows are
    read, and checked, by whoever reads them next)."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(str(path), None, "is a folder, not a results store" if path.is_dir() else "no such results store")
    _header(path)


def read_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    """Every row of the store as a dict of strings (missing cells ''); [] when there is no store."""
    if _header(Path(path)) is None:
        return []
    try:
        with open(path, newline="") as f:
            return [dict(r) for r in csv.DictReader(f, restval="")]
    except (UnicodeDecodeError, csv.Error) as e:
        raise SpecError(str(path), None, f"not a readable results store: {e}") from None


def traces_of(rows: list[dict]) -> list[str]:
    """The executor trace paths the rows' runs kept (a row's `traces`: paths joined by ';')."""
    return [t for r in rows for t in str(r.get("traces") or "").split(";") if t]
