"""Acceptance: constants fitted on D030 and D107 only (in-sample), every other published run
predicted out of sample. Run with `-s` to see the table (also `python -m calibration.fit`)."""
import pytest

from calibration.cases import all_cases
from calibration.fit import FITTED, evaluate, fit, table

# Out-of-sample cases the current mechanisms miss (kept visible, not hidden): see README.
KNOWN_MISSES = {
    "strata-qwen3.8-mtp-2k": "CPU-bound at the DeepSeek-fitted skew (hot-profile hit ~0.65 over a 4-token "
                             "MTP union); 97 tok/s needs >= 0.78 at Strata's 24.5 GB/s i-quant CPU rate",
}


@pytest.fixture(scope="module")
def fitted():
    return fit()


@pytest.fixture(scope="module")
def rows(fitted):
    out = evaluate(fitted)
    print("\nfitted:", ", ".join(f"{k} = {v:.4g}" for k, v in fitted.items()))
    print(table(out))
    return {r["case"]: r for r in out}


def test_at_most_three_constants_fitted_on_d030_d107(fitted, rows):
    """The fit uses <= 3 constants and only the in-sample cases; both land within 3%."""
    assert len(fitted) <= 3 and set(fitted) == set(FITTED)
    fit_cases = [c.name for c in all_cases() if c.role == "fit"]
    assert fit_cases == ["D030-zero-copy", "D107-cpu-tier-cache"]
    for name in fit_cases:
        assert abs(rows[name]["error"]) < 0.03, rows[name]


@pytest.mark.parametrize("name", [c.name for c in all_cases() if c.role == "test"])
def test_out_of_sample_case(name, rows, request):
    """Each out-of-sample published run is within its tolerance (or the published band)."""
    if name in KNOWN_MISSES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_MISSES[name], strict=True))
    r = rows[name]
    assert r["ok"], f"{name}: predicted {r['predicted']:.2f} vs measured {r['measured']} ({100 * r['error']:+.1f}%)"


def test_case_names_start_with_run_id():
    """Every case is a named regress case whose name starts with its run id."""
    ids = ("D030", "D061", "D107", "D119", "D141", "prefill", "rtx5070", "strata-qwen3.8")
    for c in all_cases():
        assert c.name.startswith(ids) and c.source and 0 < c.tolerance <= 0.2
