"""numba's on-disk cache across modules: cache=True watches only a cached function's own file, so a
module whose kernels compile in code from others drops its cached kernels when one of them changes."""
from __future__ import annotations

import os
from pathlib import Path

# settings read at import whose value is compiled into the kernels as a constant: a change drops the caches too
_SWITCHES = ("MOE_OFFLOAD_NO_VNNI",)


def drop_stale_cache(stem: str, deps: tuple[str, ...], here: str | Path | None = None) -> None:
    """numba's cache=True watches only the cached function's own file: drop module `stem`'s cached
    kernels when one of the modules `deps` changed, since their code is compiled in. `here`: the module's
    folder (default: this package's), which `deps` are relative to."""
    here = Path(here).resolve() if here else Path(__file__).resolve().parent
    srcs = [here / d for d in deps]
    stamp = here / "__pycache__" / f"{stem}.deps-stamp"
    now = " ".join([f"{f.stat().st_mtime_ns} {f.stat().st_size}" for f in srcs]
                   + [f"{k}={os.environ.get(k, '')}" for k in _SWITCHES])
    try:
        if stamp.exists() and stamp.read_text() == now:
            return
        for f in (here / "__pycache__").glob(f"{stem}.*.nb[ic]"):
            f.unlink()
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(now)
    except OSError:  # read-only install: the cache is whatever was shipped
        pass
