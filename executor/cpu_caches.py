"""This CPU's cache sizes, from sysfs: what the kernels size their blocks by (qgemm's token groups)."""
from __future__ import annotations

import re
from pathlib import Path

SYSFS_CACHES = "/sys/devices/system/cpu/cpu0/cache"


def cache_bytes(level: int | None = None, root: str = SYSFS_CACHES) -> int | None:
    """Bytes of cpu0's data (or unified) cache at `level` (None: the highest level sysfs lists, the last-level
    cache), the largest where several are listed; None where sysfs has none."""
    best = None
    for d in sorted(Path(root).glob("index*")):
        try:
            lv, size = int((d / "level").read_text()), (d / "size").read_text().strip()
            kind = (d / "type").read_text().strip() if (d / "type").exists() else "Unified"
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if not m or kind == "Instruction" or (level is not None and lv != level):
            continue
        n = int(m[1]) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]
        if best is None or lv > best[0] or (lv == best[0] and n > best[1]):
            best = (lv, n)
    return best[1] if best else None
