"""numba's on-disk cache across modules (executor/nbcache.py): a module's cached kernels go when a module
compiled into them changes, and stay while none does."""
import os

from executor.nbcache import drop_stale_cache


def _module(tmp_path):
    """A folder `pkg` with a module's two cached kernels and, beside the folder, the module they compile in."""
    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    dep = tmp_path / "dep.py"
    dep.write_text("X = 1\n")
    cached = [pkg / "__pycache__" / f"mod.f-1.py311.{ext}" for ext in ("nbi", "1.nbc")]
    return pkg, dep, cached


def test_cached_kernels_stay_while_no_dependency_changes(tmp_path):
    pkg, dep, cached = _module(tmp_path)
    drop_stale_cache("mod", ("../dep.py",), pkg)  # first stamp: nothing known, so the caches are dropped
    for f in cached:
        f.write_text("")
    drop_stale_cache("mod", ("../dep.py",), pkg)
    assert all(f.exists() for f in cached)


def test_a_changed_dependency_in_another_folder_drops_them(tmp_path):
    pkg, dep, cached = _module(tmp_path)
    drop_stale_cache("mod", ("../dep.py",), pkg)
    for f in cached:
        f.write_text("")
    other = pkg / "__pycache__" / "other.g-3.py311.nbi"  # another module's kernel: not this module's to drop
    other.write_text("")
    dep.write_text("X = 22\n")
    os.utime(dep, ns=(1, 1))
    drop_stale_cache("mod", ("../dep.py",), pkg)
    assert not any(f.exists() for f in cached) and other.exists()
