"""The results store: append-only, every row stamped, columns may grow, concurrent appends safe."""
import multiprocessing as mp
import os

import pytest

from calibration import store


def test_first_append_writes_header_and_stamps(tmp_path):
    p = tmp_path / "r.csv"
    store.append(p, "calibrate:mem_read", "gbs", 21.5, threads=2)
    rows = store.read_rows(p)
    assert len(rows) == 1
    r = rows[0]
    assert list(r)[:6] == list(store.BASE_COLUMNS)
    assert r["case"] == "calibrate:mem_read" and float(r["value"]) == 21.5 and r["threads"] == "2"
    assert r["time"].endswith("Z") and r["machine"] and r["commit"]


def test_appends_never_rewrite_existing_lines(tmp_path):
    p = tmp_path / "r.csv"
    store.append(p, "a", "m", 1.0)
    before = p.read_bytes()
    store.append(p, "b", "m", 2.0)
    after = p.read_bytes()
    assert after.startswith(before)  # same columns: a pure append
    assert [r["case"] for r in store.read_rows(p)] == ["a", "b"]


def test_new_column_widens_header_and_keeps_old_rows(tmp_path):
    p = tmp_path / "r.csv"
    store.append(p, "a", "m", 1.0, threads=1)
    store.append(p, "b", "m", 2.0, size_bytes=4096)
    rows = store.read_rows(p)
    assert [r["case"] for r in rows] == ["a", "b"]
    assert rows[0]["threads"] == "1" and rows[0]["size_bytes"] == ""
    assert rows[1]["size_bytes"] == "4096" and rows[1]["threads"] == ""
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_rows_must_have_base_columns(tmp_path):
    with pytest.raises(ValueError):
        store.append_rows(tmp_path / "r.csv", [{"case": "a", "value": 1}])
    with pytest.raises(ValueError):
        store.make_row("a", "m", 1.0, machine="x")


def test_interrupted_rewrite_leaves_store_intact(tmp_path, monkeypatch):
    p = tmp_path / "r.csv"
    store.append(p, "a", "m", 1.0)
    before = p.read_bytes()

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(store.os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        store.append(p, "b", "m", 2.0, new_col="x")  # needs a whole-file rewrite
    assert p.read_bytes() == before
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def _writer(path, k, n):
    for i in range(n):
        store.append(path, f"proc{k}", "i", float(i), extra=f"{k}-{i}" * (i % 3 + 1))


def test_concurrent_appends_lose_nothing(tmp_path):
    p = tmp_path / "r.csv"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(p), k, 40)) for k in range(4)]
    for q in procs:
        q.start()
    for q in procs:
        q.join(30)
        assert q.exitcode == 0
    rows = store.read_rows(p)
    assert len(rows) == 160
    for k in range(4):
        vals = sorted(float(r["value"]) for r in rows if r["case"] == f"proc{k}")
        assert vals == [float(i) for i in range(40)]


def test_read_missing_store_is_empty(tmp_path):
    assert store.read_rows(tmp_path / "none.csv") == []


def test_default_path_env(monkeypatch, tmp_path):
    monkeypatch.setenv(store.ENV_PATH, str(tmp_path / "x.csv"))
    assert store.default_store_path() == tmp_path / "x.csv"
