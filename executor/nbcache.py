"""numba's on-disk cache across modules: cache=True watches only a cached function's own file, so a
module whose kernels compile in code from others drops its cached kernels when one of them changes.
Which others: every project source the module imports, followed through their own imports, so that no
list kept by hand can miss one (session 29 found one that did)."""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

# settings read at import whose value is compiled into the kernels as a constant: a change drops the caches too
_SWITCHES = ("MOE_OFFLOAD_NO_VNNI", "MOE_OFFLOAD_QGEMM", "MOE_OFFLOAD_GEMM_INT8", "MOE_OFFLOAD_ZMM",
             "MOE_OFFLOAD_TOKEN_GROUP_BYTES", "MOE_OFFLOAD_PREFETCH_BYTES")
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+)", re.M)


def _module_file(base: Path, parts: list[str]) -> Path | None:
    """The source file of module `parts` under folder `base` (a module or a package's __init__), if there is one."""
    p = base.joinpath(*parts)
    for f in (p.with_suffix(".py"), p / "__init__.py"):
        if parts and f.is_file():
            return f.resolve()
    return None


@lru_cache(maxsize=None)
def _imports(src: Path) -> frozenset[Path]:
    """The project sources `src` imports directly: relative imports, and absolute ones of a package beside its own."""
    text, root, found = src.read_text(), src.parent.parent, set()
    for dots, mod, names in _FROM.findall(text):
        base = src.parent
        for _ in range(max(len(dots) - 1, 0)):
            base = base.parent
        parts = mod.split(".") if mod else []
        if not dots:
            base = root
        found.add(_module_file(base, parts))
        for name in re.findall(r"\w+", re.sub(r"#[^\n]*", "", names)):
            found.add(_module_file(base, parts + [name]))  # `from . import simd`: the names are modules
    for mod in _IMPORT.findall(text):
        found.add(_module_file(root, mod.split(".")))
    found.discard(None)
    found.discard(src.resolve())
    return frozenset(found)


def source_deps(module_file: str | Path) -> list[Path]:
    """Every project source file that `module_file` imports, directly or through others (sorted)."""
    todo, seen = [Path(module_file).resolve()], set()
    while todo:
        for dep in _imports(todo.pop()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    seen.discard(Path(module_file).resolve())
    return sorted(seen)


def use_switch_cache() -> None:
    """Kernels built under a switch (_SWITCHES set) cache apart from the default build, in numba's cache folder
    executor/__pycache__/nb-<switches>, unless NUMBA_CACHE_DIR names one: flipping a switch (`execute --gemm-int8`)
    then neither drops nor rebuilds the other build's kernels. Call before any kernel module loads."""
    on = "+".join(f"{k[len('MOE_OFFLOAD_'):].lower()}-{os.environ[k]}" for k in _SWITCHES if os.environ.get(k, ""))
    if on and not os.environ.get("NUMBA_CACHE_DIR"):
        from numba.core import config
        config.CACHE_DIR = str(Path(__file__).resolve().parent / "__pycache__" / ("nb-" + re.sub(r"[^\w+-]", "_", on)))


def cache_dir(src: Path) -> Path:
    """Where numba caches the kernels of source file `src`: numba.config.CACHE_DIR's folder for it where one is set
    (numba's UserProvidedCacheLocator), else its __pycache__."""
    from numba.core import config
    if config.CACHE_DIR:
        from numba.core.caching import UserProvidedCacheLocator
        return Path(config.CACHE_DIR) / UserProvidedCacheLocator.get_suitable_cache_subpath(str(src))
    return src.parent / "__pycache__"


def drop_stale_cache(module_file: str | Path) -> None:
    """numba's cache=True watches only the cached function's own file: drop the cached kernels of the module at
    `module_file` (its __file__) when one of the project sources it imports changed, since their code is compiled in
    (source_deps)."""
    src = Path(module_file).resolve()
    folder = cache_dir(src)
    stamp = folder / f"{src.stem}.deps-stamp"
    now = " ".join([f"{f.name}:{f.stat().st_mtime_ns}:{f.stat().st_size}" for f in source_deps(src)]
                   + [f"{k}={os.environ.get(k, '')}" for k in _SWITCHES])
    try:
        if stamp.exists() and stamp.read_text() == now:
            return
        for f in folder.glob(f"{src.stem}.*.nb[ic]"):
            f.unlink()
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(now)
    except OSError:  # read-only install: the cache is whatever was shipped
        pass
