"""Stored llama-bench sittings predicted on stored `calibrate` profiles (regress's local rows), and stored executor
sittings simulated on them, for the data tests."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from calibration import regress, store
from simulator.run import simulate
from specs.plan import Plan

ROOT = Path(__file__).resolve().parents[2]


def stored_profile(data: Path, profile: str) -> dict:
    """The profile host-calibrated-<profile>.yaml of the data folder `data` (relative to the repo root), parsed."""
    return yaml.safe_load((ROOT / data / f"host-calibrated-{profile}.yaml").read_text())


@lru_cache(maxsize=1)
def scratch() -> Path:
    """A folder for the data tests' changed copies of stored profiles, removed when the test process exits (they are
    created by cached helpers, outside any one test's tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix="stored-runs-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@lru_cache(maxsize=None)
def stored_rows(data: Path, sitting: str, profile: str, drop: str | None = None,
                drop_cpu_field: str | None = None, drop_repacked: str | None = None) -> tuple[dict, ...]:
    """regress's rows of data/results-llamacpp-<sitting>.csv on data/host-calibrated-<profile>.yaml, run from the
    repo root (the stores' model paths are relative to it); with `drop`, the profile's ggml prefill rates whose keys
    hold it removed first, with `drop_repacked` its repacked decode rates whose keys hold that, with
    `drop_cpu_field` that field of its cpu section (a copy in a scratch folder)."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    try:
        path = data / f"host-calibrated-{profile}.yaml"
        if drop or drop_cpu_field or drop_repacked:
            d = stored_profile(data, profile)
            for table, part in (("ggml_prefill_gflops", drop), ("repacked_gbs", drop_repacked)):
                if part:
                    d["cpu"][table] = {k: v for k, v in d["cpu"][table].items() if part not in k}
            d["cpu"].pop(drop_cpu_field, None)
            path = scratch() / f"{data.name}-{profile}-no-{drop}-{drop_cpu_field}-{drop_repacked}.yaml"
            path.write_text(yaml.safe_dump(d))
        return tuple(regress.local_rows(data / f"results-llamacpp-{sitting}.csv", str(path)))
    finally:
        mp.undo()


# the profile tables of llama.cpp's CPU expert kernels: its decode rates, and its prefill rates on the paths that
# run a vec_dot or a repacked gemv (the ones calibrate times on a llama.cpp build's own kernels, bench_ggml_own)
KERNEL_TABLES = ("rowwise_gbs", "repacked_gbs")


def _kernel_prefill_key(key: str) -> bool:
    """A ggml_prefill_gflops key of the vecdot path ('Q8_0', 'Q8_0@1t': no path in it) or the repacked one."""
    return ":" not in key or ":repacked" in key


@lru_cache(maxsize=None)
def rows_with_kernels_of(data: Path, sitting: str, profile: str, kernels_from: str) -> tuple[dict, ...]:
    """regress's rows of that sitting on `profile` with its llama.cpp kernel rates (KERNEL_TABLES, and the prefill
    rates of the vecdot and repacked paths) those of profile `kernels_from`: the same machine state but for the
    kernels."""
    d, src = stored_profile(data, profile), stored_profile(data, kernels_from)["cpu"]
    for table in KERNEL_TABLES:
        d["cpu"][table] = src[table]
    g = {k: v for k, v in d["cpu"]["ggml_prefill_gflops"].items() if not _kernel_prefill_key(k)}
    g.update({k: v for k, v in src["ggml_prefill_gflops"].items() if _kernel_prefill_key(k)})
    d["cpu"]["ggml_prefill_gflops"] = g
    return rows_on(data, sitting, d, f"{profile}-kernels-of-{kernels_from}")


@lru_cache(maxsize=None)
def rows_with_rowwise_of(data: Path, sitting: str, profile: str, rates_from: str, keys: tuple[str, ...]) -> tuple[dict, ...]:
    """regress's rows of that sitting on `profile` with its rowwise rates `keys` (e.g. F16's) those of profile
    `rates_from`: one kernel's effect on the same machine state."""
    d, src = stored_profile(data, profile), stored_profile(data, rates_from)["cpu"]["rowwise_gbs"]
    d["cpu"]["rowwise_gbs"].update({k: src[k] for k in keys if k in src})
    return rows_on(data, sitting, d, f"{profile}-rowwise-of-{rates_from}-{'-'.join(keys).replace('@', '')}")


def rows_on(data: Path, sitting: str, profile: dict, name: str) -> tuple[dict, ...]:
    """regress's rows of data/results-llamacpp-<sitting>.csv on the profile `profile` (a parsed, changed copy of a
    stored one, written to the scratch folder as <data>-<name>.yaml), run from the repo root."""
    path = scratch() / f"{data.name}-{name}.yaml"
    path.write_text(yaml.safe_dump(profile))
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    try:
        return tuple(regress.local_rows(data / f"results-llamacpp-{sitting}.csv", str(path)))
    finally:
        mp.undo()


def repacked_rows(data: Path, sittings, profile: str, fmt: str, own: bool) -> list[dict]:
    """The rows of those sittings on `profile`, with its rates for llama.cpp's repacked `fmt` (its own gemv's, prefill
    and decode) or without them (the rebuilt Q4_0 gemv stands in, specs.formats.LLAMACPP_REPACKED_STAND_IN)."""
    return [r for s in sittings for r in stored_rows(data, s, profile, drop=None if own else f"{fmt}:repacked",
                                                     drop_repacked=None if own else fmt)]


def prefill_rows(rows) -> list[dict]:
    """The pp rows of regress's rows."""
    return [r for r in rows if r["metric"] == "prefill_tok_s"]


def assert_every_run_predicted(data: Path, sittings, decode_sittings, profile: str) -> None:
    """14 pp512 runs a sitting (the seven `small` files, each repacked and in place), and 14 tg64 in decode_sittings,
    each predicted above 0 on `profile`."""
    for s in sittings:
        rows = stored_rows(data, s, profile)
        assert len(prefill_rows(rows)) == 14 and all(r["predicted"] > 0 for r in rows)
        assert len(rows) == (28 if s in decode_sittings else 14)


def tg_case(r: dict) -> tuple[str, str, str]:
    """(threads 't1' / 't2', 'rp' / 'norp', file) of a stored llama-bench tg row."""
    c = r["case"]
    threads, layout = "t" + c.split("-t ")[1].split(" ")[0], "norp" if "--no-repack" in c else "rp"
    return threads, layout, c.split("synthetic ")[1].split(" ")[0]


def mean_errors(data: Path, sittings, profiles, kernels_from=None, keys: tuple[str, ...] = ()) -> dict[tuple, float]:
    """Each tg_case's mean error over the sittings and the profiles (with kernels_from, a profile each: their kernel
    rates swapped in, rows_with_kernels_of; with keys too, only those rowwise rates, rows_with_rowwise_of)."""
    acc: dict[tuple, list[float]] = {}
    for s in sittings:
        for i, p in enumerate(profiles):
            if kernels_from is None:
                rows = stored_rows(data, s, p)
            elif keys:
                rows = rows_with_rowwise_of(data, s, p, kernels_from[i], keys)
            else:
                rows = rows_with_kernels_of(data, s, p, kernels_from[i])
            for r in rows:
                acc.setdefault(tg_case(r), []).append(r["error"])
    return {k: sum(v) / len(v) for k, v in acc.items()}


@lru_cache(maxsize=None)
def executor_rows(data: Path, sitting: str) -> tuple[dict, ...]:
    """The rows of data/results-executor-<sitting>.csv (calibration.local.measure's)."""
    return tuple(store.read_rows(ROOT / data / f"results-executor-{sitting}.csv"))


def executor_measured(data: Path, sitting: str, case: str) -> float:
    """The measured value (decode tok/s) of that sitting's run `case`."""
    return float(next(r["value"] for r in executor_rows(data, sitting) if r["case"] == case))


def executor_predicted(data: Path, sitting: str, case: str, hw) -> float:
    """decode tok/s of that sitting's run `case` simulated on the profile `hw`, on its own routing and page layout
    (run from the repo root: the stores' paths are relative to it)."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    try:
        r = next(r for r in executor_rows(data, sitting) if r["case"] == case)
        plan = Plan.model_validate_json(r["plan"])
        return simulate(regress.run_model(r["model"], plan), hw, plan, prompt_tokens=int(r["n_prompt"]),
                        gen_tokens=int(r["n_gen"]), routing=r["routing"], warm_steps=0).decode_tok_s
    finally:
        mp.undo()
