"""`moe-offload regress`: predicted against measured per case, exit 1 when one drifts."""
import json

from calibration.store import append
from moe_offload.cli import main
from specs.plan import Placement, Plan


def test_in_sample_case_passes_with_exit_0(capsys):
    assert main(["regress", "--case", "D030", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["cases"]
    assert row["case"] == "D030-zero-copy" and row["role"] == "in-sample" and abs(row["error"]) < 0.02


def test_a_case_out_of_tolerance_exits_1(capsys, tmp_path):
    """A local run whose measurement is far from the prediction fails the check."""
    store = tmp_path / "results.csv"
    plan = Plan(placement=Placement(dense="cpu", kv="cpu"), kv={"context": 4096})
    append(store, "cpu-only-fake", "decode_tok_s", 1e6, model="qwen3.8-flash-next-iq3_s", engine="test",
           plan=plan.model_dump_json(), n_prompt=0, n_gen=8)
    code = main(["regress", "--local-only", "--hw", "i5-13600k-ddr5-3090", "--store", str(store), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["summary"]["local"]["failed"] == ["cpu-only-fake"]
