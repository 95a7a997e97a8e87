"""Fits from executor traces: the quick path end to end on `tiny` (make, execute three plans, fit,
simulate, compare), and bad input (a trace of another model, a malformed trace, a base profile
without a measured field, a host profile without its fitted constants): one line, exit 2."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from calibration import trace_fit
from calibration.local import _cache, _plan
from moe_offload.cli import main
from simulator.run import simulate
from specs.errors import SpecError
from specs.figure import Figure
from specs.hardware import CPU, NVMe, HardwareSpec, Memory
from specs.loaders import dump_hardware, load_hardware, load_model
from specs.plan import Placement

GEN, PROMPT = 12, 8


def base_profile(measured: bool = True) -> HardwareSpec:
    """A CPU-only profile whose figures stand in for `calibrate`'s measurements (no timing here)."""
    src = "measured" if measured else "assumed"
    m = lambda v: Figure(v, src, "test stand-in for a calibrate measurement")  # noqa: E731
    return HardwareSpec(
        name="test-host",
        memory=Memory(channels=2, mts=Figure(3200, "assumed"), capacity_bytes=Figure(16e9, "assumed"),
                      efficiency=m(0.45), os_reserve_bytes=Figure(1e9, "assumed")),
        cpu=CPU(model="test", cores=2, threads_used=2,
                expert_gbs={"F16": m(15.0), "Q8_0": m(12.0), "default": m(10.0)}),
        nvme=NVMe(seq_read_gbs=Figure(1.5, "assumed"), rand_4k_iops=Figure(3e4, "assumed"),
                  latency_us=Figure(90, "assumed"), capacity_bytes=Figure(1e11, "assumed")),
        constants={"sync_ms": Figure(0.03, "measured", "test stand-in")})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """tiny, three plans executed with traces: [(name, plan, result)]."""
    from executor.make_model import make_model
    from executor.runner import execute
    d = tmp_path_factory.mktemp("tf")
    path = make_model("tiny", d / "tiny.gguf")
    m = load_model(str(path))
    plans = {"all-cpu": _plan(PROMPT),
             "cache30": _plan(PROMPT, expert_cache=_cache(round(0.3 * m.n_layers * m.n_experts))),
             "static": _plan(PROMPT, placement=Placement(engram="none", gpu_expert_layers=[2, 3]))}
    out = []
    for name, plan in plans.items():
        r = execute(plan, path, prompt_tokens=PROMPT, gen_tokens=GEN, trace_path=d / f"{name}.jsonl")
        out.append((name, plan, r))
    return path, m, d, out


def test_fit_structure_and_errors(runs):
    path, m, d, out = runs
    hw, f, errs = trace_fit.calibrate_from_traces([r["trace"] for _, _, r in out], str(path), base_profile(),
                                                  out=d / "fitted.yaml", log=None)
    assert hw.gpu is not None and hw.gpu.shares_host
    for k in ("layer_overhead_ms", "device_layer_ms", "cpu_job_ms", "dev_expert_gbs", "dev_bytes_per_param",
              "handover_ms"):
        assert k in hw.constants, k
    assert hw.constants["layer_overhead_ms"].source == "measured"
    assert f.cpu_expert_ms > 0 and f.hit_ms and f.hit_ms > 0
    assert [e["trace"] for e in errs] == [r["trace"] for _, _, r in out]
    assert all(e["in_sample"] is not None and e["out_of_sample"] is not None for e in errs)
    reloaded = load_hardware(str(d / "fitted.yaml"))
    assert reloaded.gpu.shares_host and float(reloaded.constants["layer_overhead_ms"]) == pytest.approx(
        f.layer_overhead_ms)


def test_fit_reduces_simulator_error(runs):
    """Simulated decode tok/s on the fitted profile is closer to the executor than on the unfitted one."""
    path, m, d, out = runs
    fitted, _, _ = trace_fit.calibrate_from_traces([r["trace"] for _, _, r in out], str(path), base_profile(),
                                                   log=None)
    consts = {k: v for k, v in fitted.constants.items()
              if k not in ("layer_overhead_ms", "cpu_job_ms", "dev_expert_gbs", "cpu_prefill_gflops_per_core")}
    unfitted = fitted.model_copy(update={"constants": consts, "cpu": base_profile().cpu})

    def err(hw):
        e = []
        for _, plan, r in out:
            s = simulate(m, hw, plan, prompt_tokens=PROMPT, gen_tokens=GEN, routing=r["trace"], warm_steps=0)
            e.append(abs(s.decode_tok_s / r["decode_tok_s"] - 1))
        return statistics.median(e)

    assert err(fitted) < err(unfitted)


def _other_model_trace(src: str, dst: Path) -> Path:
    """A copy of `src` whose records claim twice the layers and experts (a trace of another model)."""
    lines = []
    for line in Path(src).read_text().splitlines():
        r = json.loads(line)
        for k in range(2):
            lines.append(json.dumps({**r, "layer": r["layer"] * 2 + k, "hits": [e + 32 for e in r["hits"]]}))
    dst.write_text("\n".join(lines) + "\n")
    return dst


def test_trace_of_another_model(runs, tmp_path):
    path, m, d, out = runs
    bad = _other_model_trace(out[0][2]["trace"], tmp_path / "other.jsonl")
    with pytest.raises(SpecError, match="another model"):
        trace_fit.check_trace(trace_fit.read_trace(bad), m, str(bad))


def _cli(args, capsys):
    code = main(args)
    err = capsys.readouterr().err.strip()
    return code, err


def test_cli_bad_inputs(runs, tmp_path, capsys):
    path, m, d, out = runs
    good = out[0][2]["trace"]
    base = tmp_path / "base.yaml"
    base.write_text(dump_hardware(base_profile()))
    other = _other_model_trace(good, tmp_path / "other.jsonl")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"phase": "decode"\n')
    assumed = tmp_path / "assumed.yaml"
    assumed.write_text(dump_hardware(base_profile(measured=False)))
    outp = tmp_path / "out.yaml"
    for args, needle in (
        ([str(other)], "another model"),
        ([str(garbage)], "not JSON"),
    ):
        code, err = _cli(["calibrate", "--from-trace", *args, "--model", str(path), "--hw-base", str(base),
                          "--out", str(outp)], capsys)
        assert code == 2 and len(err.splitlines()) == 1 and needle in err, err
    code, err = _cli(["calibrate", "--from-trace", good, "--model", str(path), "--hw-base", str(assumed),
                      "--out", str(outp)], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "not measured" in err, err
    assert not outp.exists()
    code, err = _cli(["calibrate", "--from-trace", good, "--model", str(path), "--hw-base", str(base),
                      "--out", str(outp)], capsys)
    assert code == 0 and outp.exists()
    # a host-sharing profile without its fitted constants
    hw = load_hardware(str(outp))
    stripped = tmp_path / "stripped.yaml"
    stripped.write_text(dump_hardware(hw.model_copy(update={"constants": {}})))
    st = tmp_path / "results.csv"
    st.write_text("time,commit,machine,case,metric,value\n")
    code, err = _cli(["regress", "--local-only", "--hw", str(stripped), "--store", str(st)], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "layer_overhead_ms" in err, err
