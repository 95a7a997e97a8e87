"""numba's on-disk cache across modules (executor/nbcache.py): a module's cached kernels go when a project source it
imports, directly or through others, changes, and stay while none does."""
import os
from pathlib import Path

from executor.nbcache import drop_stale_cache, source_deps

ROOT = Path(__file__).resolve().parents[2]


def _package(tmp_path):
    """pkg/mod.py (two cached kernels) imports pkg/dep.py, which imports `other`, a package beside pkg."""
    pkg, other = tmp_path / "pkg", tmp_path / "other"
    (pkg / "__pycache__").mkdir(parents=True)
    other.mkdir()
    (pkg / "__init__.py").write_text("")
    (other / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("from .dep import X  # noqa\n")
    (pkg / "dep.py").write_text("from other.deeper import (\n    Y,  # the names are not modules\n)\nX = Y\n")
    (other / "deeper.py").write_text("Y = 1\n")
    cached = [pkg / "__pycache__" / f"mod.f-1.py311.{ext}" for ext in ("nbi", "1.nbc")]
    return pkg / "mod.py", other / "deeper.py", cached


def test_source_deps_follow_imports_through_modules_and_packages(tmp_path):
    """A relative import, then an absolute one of a package beside it; imported names that are not modules (and a
    comment among them) add nothing."""
    mod, deeper, _ = _package(tmp_path)
    assert source_deps(mod) == sorted([(mod.parent / "dep.py").resolve(), deeper.resolve()])


def test_cached_kernels_stay_while_no_dependency_changes(tmp_path):
    mod, _, cached = _package(tmp_path)
    drop_stale_cache(mod)  # first stamp: nothing known, so the caches are dropped
    for f in cached:
        f.write_text("")
    drop_stale_cache(mod)
    assert all(f.exists() for f in cached)


def test_a_changed_module_two_imports_away_drops_them(tmp_path):
    mod, deeper, cached = _package(tmp_path)
    drop_stale_cache(mod)
    for f in cached:
        f.write_text("")
    other = mod.parent / "__pycache__" / "dep.g-3.py311.nbi"  # another module's kernel: not this module's to drop
    other.write_text("")
    deeper.write_text("Y = 22\n")
    os.utime(deeper, ns=(1, 1))
    drop_stale_cache(mod)
    assert not any(f.exists() for f in cached) and other.exists()


def test_the_executors_drivers_watch_every_kernel_source():
    """Session 29 found by reading that a hand-kept list missed iquants.py; now the imports decide: the drivers that
    call the row products, and calibration's kernels that compile the executor's in, watch each kernel file."""
    kernels = {ROOT / "executor" / f for f in ("simd.py", "kquants.py", "iquants.py", "vnni.py", "gemm.py",
                                               "row_products.py", "kernel_table.py")}
    for user in ("executor/kernels.py", "executor/cpu_experts.py", "executor/cpu_layers.py",
                 "executor/dense_kernels.py", "calibration/bench_rowwise.py"):
        assert kernels <= set(source_deps(ROOT / user)), user
