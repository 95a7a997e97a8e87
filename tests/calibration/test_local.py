"""Local reference cases: the plans the issue names, measured runs in the results store with what
`regress --hw` needs to predict them, the quiet-run selection, and `regress --measure` wiring."""
from __future__ import annotations

import pytest

from calibration import local, regress, store, trace_profile
from moe_offload.cli import main
from specs.loaders import dump_hardware, load_model

from .test_trace_fit import base_profile


def test_cases_cover_the_issue():
    cs = {c.name: c for c in local.local_cases(8, 32)}
    assert set(cs) == {"local-all-cpu", "local-cache10", "local-cache30", "local-cache60", "local-static-half",
                       "local-engram", "local-4streams", "local-ttft-512", "local-ttft-2048"}
    slots = {n: cs[n].plan.expert_cache.slots for n in ("local-cache10", "local-cache30", "local-cache60")}
    assert slots == {"local-cache10": 26, "local-cache30": 77, "local-cache60": 154}
    assert cs["local-all-cpu"].plan.expert_cache.slots == 0
    assert cs["local-static-half"].plan.placement.gpu_expert_layers == [4, 5, 6, 7]
    assert [n for n, c in cs.items() if c.plan.placement.engram != "none"] == ["local-engram"]
    assert cs["local-4streams"].plan.streams == 4
    assert (cs["local-ttft-512"].n_prompt, cs["local-ttft-2048"].n_prompt) == (512, 2048)
    assert {c.metric for n, c in cs.items() if "ttft" in n} == {"ttft_s"}
    for c in cs.values():  # the executor prefills in one batch on the CPU: the plan says so
        assert c.plan.prefill.strategy == "cpu" and c.plan.prefill.ubatch_tokens >= c.n_prompt


def test_keep_prefers_quiet_runs():
    runs = [(10.0, 0.5, {}), (20.0, 0.02, {}), (21.0, 0.04, {}), (30.0, 0.3, {})]
    assert [v for v, _, _ in local._keep(runs)] == [20.0, 21.0]
    busy = [(10.0, 0.5, {}), (12.0, 0.52, {}), (30.0, 0.9, {})]
    assert [v for v, _, _ in local._keep(busy)] == [10.0, 12.0]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from executor.make_model import make_model
    d = tmp_path_factory.mktemp("local")
    path = make_model("tiny", d / "tiny.gguf", engram=True)
    m = load_model(str(path))
    cases = [c for c in local.local_cases(m.n_layers, m.n_experts, n_gen=8, n_prompt=8, ttft_prompts=(16,))
             if c.name in ("local-all-cpu", "local-cache30", "local-static-half", "local-ttft-16")]
    st = d / "results.csv"
    rows = local.measure(path, cases, st, rounds=1, extra=0, trace_dir=d / "traces", log=None)
    return path, m, d, st, rows


def test_measure_appends_predictable_rows(measured):
    path, m, d, st, rows = measured
    got = store.read_rows(st)
    assert len(got) == len(rows) == 4
    for r in got:
        assert r["engine"] == local.ENGINE and r["model"] == str(path) and r["plan"].startswith("{")
        assert int(r["n_prompt"]) >= 8 and int(r["n_gen"]) >= 2 and r["routing"].endswith(".jsonl")
        assert float(r["value"]) > 0 and 0.0 <= float(r["outside_cpu"]) <= 1.0
    traces = [t for r in rows for t in r["traces"].split(";")]
    fitted = d / "fitted.yaml"
    trace_profile.calibrate_from_traces(traces, str(path), base_profile(), out=fitted, log=None)
    out = regress.local_rows(st, str(fitted))
    assert {r["case"] for r in out} == {r["case"] for r in rows}
    assert all(r["predicted"] > 0 and r["role"] == "local" for r in out)
    assert {r["metric"] for r in out} == {"decode_tok_s", "ttft_s"}


def test_each_stored_plan_carries_the_page_layout_its_run_read(measured):
    """Each stored plan's cpu_file_page_breaks is the model file's page layout right after its median run
    (page_layout.page_breaks_of, a share in [0, 1]; where frame numbers are hidden the plan's own, 0); a result
    without one leaves the plan as it was."""
    from specs.plan import Plan
    _, _, _, st, _ = measured
    for r in store.read_rows(st):
        assert 0.0 <= Plan.model_validate_json(r["plan"]).cpu_file_page_breaks <= 1.0
    assert Plan.model_validate_json(local.with_page_breaks(Plan(), {"model_page_breaks": 0.25})).cpu_file_page_breaks \
        == 0.25
    assert local.with_page_breaks(Plan(), {"model_page_breaks": None}) == Plan().model_dump_json()


def test_engram_sidecar_makes_the_model_read_it(measured):
    path, m, *_ = measured
    assert m.engram is None
    e = regress.with_engram(m, str(path)).engram
    assert e is not None and e.layers == [1] and e.rows == 16384 and e.row_values == m.hidden


def test_regress_measure_runs_local_cases_first(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(local, "measure_local", lambda preset, store_path, rounds, log: calls.append(
        (preset, str(store_path), rounds)))
    hw = tmp_path / "hw.yaml"
    hw.write_text(dump_hardware(base_profile()))
    st = tmp_path / "results.csv"
    code = main(["regress", "--measure", "--preset", "tiny", "--rounds", "1", "--local-only", "--store", str(st),
                 "--json"])
    assert calls == [("tiny", str(st), 1)] and code == 0
