"""CPU expert rates by thread count: a measured rate at that count wins, else linear scaling."""
import pytest

from specs.figure import Figure
from specs.formats import parse_format
from specs.loaders import load_hardware


def _cpu(**rates):
    hw = load_hardware("epyc8ch-3090")
    gbs = {k: Figure(v, "measured", "test") for k, v in rates.items()}
    return hw.cpu.model_copy(update={"expert_gbs": gbs, "threads_used": 2})


def test_measured_one_thread_rate_is_used_for_one_thread():
    """calibrate's 'Q8_0@1t' (one core reads more than half of a bus-bound two-core rate) is what
    one thread gets; two threads get the all-core figure."""
    cpu = _cpu(Q8_0=30.0, **{"Q8_0@1t": 17.0}, default=20.0)
    q8 = parse_format("Q8_0")
    assert cpu.expert_gbs_for(q8, 1) == 17.0
    assert cpu.expert_gbs_for(q8, 2) == cpu.expert_gbs_for(q8) == 30.0


def test_without_a_measurement_the_rate_scales_with_threads():
    """No rate at that thread count: the threads_used rate times threads / threads_used."""
    cpu = _cpu(default=20.0)
    assert cpu.expert_gbs_for(parse_format("Q4_0"), 1) == pytest.approx(10.0)
    assert cpu.expert_gbs_for(parse_format("Q4_0"), 4) == pytest.approx(40.0)


def test_rowwise_rates_are_read_when_asked_and_present():
    """rowwise=True (llama.cpp plans) reads cpu.rowwise_gbs by the same keys and thread rule; a profile
    without rowwise rates, or asked without rowwise, gives the expert-kernel rates."""
    cpu = _cpu(Q8_0=30.0, default=20.0)
    q8, q4 = parse_format("Q8_0"), parse_format("Q4_0")
    assert cpu.expert_gbs_for(q8, 2, rowwise=True) == 30.0  # no rowwise table: as before
    rw = {"Q8_0": Figure(24.0, "measured", "test"), "Q8_0@1t": Figure(13.0, "measured", "test"),
          "default": Figure(16.0, "measured", "test")}
    cpu = cpu.model_copy(update={"rowwise_gbs": rw})
    assert cpu.expert_gbs_for(q8, 2, rowwise=True) == 24.0
    assert cpu.expert_gbs_for(q8, 1, rowwise=True) == 13.0
    assert cpu.expert_gbs_for(q4, 1, rowwise=True) == pytest.approx(8.0)  # default, scaled
    assert cpu.expert_gbs_for(q8, 2) == 30.0


def test_a_format_without_a_rowwise_figure_scales_by_the_default_formats_ratio():
    """A codebook format (no rowwise figure, none derived): its kernel rate x rowwise / kernel of the
    default format (6 x 16 / 20 = 4.8 GB/s), so a slower format stays slower under llama.cpp."""
    cpu = _cpu(Q8_0=30.0, codebook=6.0, default=20.0)
    cpu = cpu.model_copy(update={"rowwise_gbs": {"default": Figure(16.0, "measured", "test")}})
    assert cpu.expert_gbs_for(parse_format("EXL3:3.0"), 2, rowwise=True) == pytest.approx(4.8)
    assert cpu.expert_gbs_for(parse_format("Q8_0"), 2, rowwise=True) == pytest.approx(24.0)  # 30 x 16 / 20


def test_repacked_rates_are_read_for_a_repacked_format_only():
    """repacked=True (a llama.cpp plan whose weights of this format it repacks) reads cpu.repacked_gbs for
    the format, by the same thread rule; a format without its own repacked figure runs repack.cpp's one gemv
    structure at the rebuilt format's (Q4_0's) weights a second, 21 GB/s x 8.5 / 4.5 bits for Q8_0; with no
    repacked figure at all, its rowwise rate."""
    cpu = _cpu(Q8_0=30.0, Q4_0=28.0, default=20.0)
    q8, q4 = parse_format("Q8_0"), parse_format("Q4_0")
    f = lambda v: Figure(v, "measured", "test")  # noqa: E731
    cpu = cpu.model_copy(update={"rowwise_gbs": {"Q4_0": f(15.0), "Q8_0": f(24.0)},
                                 "repacked_gbs": {"Q4_0": f(21.0), "Q4_0@1t": f(12.0)}})
    assert cpu.expert_gbs_for(q4, 2, rowwise=True, repacked=True) == 21.0
    assert cpu.expert_gbs_for(q4, 1, rowwise=True, repacked=True) == 12.0
    assert cpu.expert_gbs_for(q4, 2, rowwise=True) == 15.0  # --no-repack: one row per dot product
    assert cpu.expert_gbs_for(q8, 2, rowwise=True, repacked=True) == pytest.approx(21.0 * 8.5 / 4.5)
    assert cpu.expert_gbs_for(q8, 1, rowwise=True, repacked=True) == pytest.approx(12.0 * 8.5 / 4.5)
    bare = cpu.model_copy(update={"repacked_gbs": {}})
    assert bare.expert_gbs_for(q8, 2, rowwise=True, repacked=True) == 24.0  # no repacked figure at all


def test_a_second_card_joins_a_profile_by_name():
    """'BASE+DEVICE' is the base profile with an expert device (specs/data/devices) added, every figure sourced."""
    hw = load_hardware("epyc8ch-3090+arc-pro-b70")
    base = load_hardware("epyc8ch-3090")
    d = hw.expert_device
    assert hw.name == "epyc8ch-3090+arc-pro-b70" and base.expert_device is None
    assert hw.gpu == base.gpu and hw.constants == base.constants  # the same host, its fitted constants kept
    assert (float(d.bw_gbs), float(d.h2d_gbs), d.vram_bytes.source) == (608.0, 27.0, "datasheet")


def test_whole_expert_rates_are_read_for_whole_jobs_on_several_threads():
    """whole=True (the executor's jobs of whole experts per thread) reads cpu.whole_gbs by the format, then its
    family; on one thread only a rate timed on one ('Q4_K@1t'; without it the kernel's own: scaling the two-thread
    whole rate down would halve a bus-bound rate), not a format the profile did not time whole, nor a profile
    without the table."""
    f = lambda v: Figure(v, "measured", "test")  # noqa: E731
    cpu = _cpu(Q8_0=30.0, Q4_K=22.0, **{"Q4_K@1t": 12.0}, default=20.0)
    q4k, q8 = parse_format("Q4_K"), parse_format("Q8_0")
    assert cpu.expert_gbs_for(q4k, 2, whole=True) == 22.0  # no whole table: as before
    cpu = cpu.model_copy(update={"whole_gbs": {"Q4_K": f(31.0)}})
    assert cpu.expert_gbs_for(q4k, 2, whole=True) == 31.0
    assert cpu.expert_gbs_for(q4k, 2) == 22.0  # rows split
    assert cpu.expert_gbs_for(q4k, 1, whole=True) == 12.0  # one thread: the kernel's own
    assert cpu.expert_gbs_for(q8, 2, whole=True) == 30.0  # not timed whole
    assert not cpu.whole_timed(1) and cpu.whole_timed(2) and cpu.whole_timed(None)
    cpu = cpu.model_copy(update={"whole_gbs": {"Q4_K": f(31.0), "Q4_K@1t": f(17.0), "Q8_0": f(40.0)}})
    assert cpu.whole_timed(1)
    assert cpu.expert_gbs_for(q4k, 1, whole=True) == 17.0 and cpu.expert_gbs_for(q4k, 1) == 12.0
    assert cpu.expert_gbs_for(q4k, 2, whole=True) == 31.0
    assert cpu.expert_gbs_for(q8, 1, whole=True) == cpu.expert_gbs_for(q8, 1) == 15.0  # whole on two threads only


def test_a_windows_fixed_tokens_are_read_by_thread_count():
    """ggml_prefill_fixed_tokens is keyed as ggml_prefill_gflops: 'KEY@1t' for one thread, else the threads_used
    figure; a key without one has none."""
    f = lambda v: Figure(v, "measured", "test")  # noqa: E731
    cpu = _cpu(default=20.0).model_copy(update={"ggml_prefill_fixed_tokens": {"Q4_K:tiled": f(12.0),
                                                                              "Q4_K:tiled@1t": f(9.0)}})
    assert cpu.ggml_prefill_fixed_tokens_for("Q4_K:tiled", 1) == 9.0
    assert cpu.ggml_prefill_fixed_tokens_for("Q4_K:tiled", 2) == cpu.ggml_prefill_fixed_tokens_for("Q4_K:tiled") == 12.0
    assert cpu.ggml_prefill_fixed_tokens_for("Q6_K:tiled", 2) is None


def test_a_negative_fixed_token_count_is_refused_naming_the_file_and_field(tmp_path):
    """A profile whose cpu.ggml_prefill_fixed_tokens holds a negative figure: one error naming the file, the field
    and the reason."""
    import yaml
    from specs.errors import SpecError
    hw = load_hardware("epyc8ch-3090").model_dump(mode="json")
    hw["cpu"]["ggml_prefill_fixed_tokens"] = {"Q4_K:tiled": {"value": -3.0, "source": "measured", "ref": "test"}}
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(hw))
    with pytest.raises(SpecError, match=r"hw.yaml.*ggml_prefill_fixed_tokens.*>= 0"):
        load_hardware(str(path))


def _paged(rowwise: dict, runs: dict):
    """A CPU with these rowwise rates and file_runs_gbs tables ({'64KiB': {'Q8_0': 20.0}})."""
    fig = lambda t: {k: Figure(v, "measured", "test") for k, v in t.items()}  # noqa: E731
    return _cpu(Q8_0=30.0, default=20.0).model_copy(update={
        "rowwise_gbs": fig(rowwise), "file_runs_gbs": {k: fig(t) for k, t in runs.items()}})


def test_file_page_excess_is_a_power_of_the_breaks_through_none_at_contiguous_pages():
    """Q8_0 rows at 24 GB/s from contiguous pages, 24 / 1.2 from a file in 64 KiB runs (breaks 1/16: +20%), 24 / 1.8
    from one in 4 KiB runs (breaks 1: +80%): the exponent ln(0.8 / 0.2) / ln 16 = 1/2; at breaks 1/4, 0.2 x 4^(1/2) =
    +40%; at 1/64, +10%; no breaks, none."""
    cpu = _paged({"Q8_0": 24.0}, {"64KiB": {"Q8_0": 24 / 1.2}, "4KiB": {"Q8_0": 24 / 1.8}})
    q8 = parse_format("Q8_0")
    assert cpu.file_page_excess(q8, 2, 1 / 16) == pytest.approx(0.2)
    assert cpu.file_page_excess(q8, 2, 1.0) == pytest.approx(0.8)
    assert cpu.file_page_excess(q8, 2, 1 / 4) == pytest.approx(0.4)
    assert cpu.file_page_excess(q8, 2, 1 / 64) == pytest.approx(0.1)
    assert cpu.file_page_excess(q8, 2, 0.0) == 0.0


@pytest.mark.parametrize("slow_4k, g", [(1.2, 0.25), (1 + 0.2 * 64, 1.0)])
def test_the_exponent_stays_within_a_quarter_and_one(slow_4k, g):
    """Noise can make the two calibrated points flat (+20% at both: exponent 0) or steep (+20%, +1280%: 1.5): the
    exponent is held to [1/4, 1], so that long runs still cost little and short ones not without bound; the power
    runs through the point of the run length the table times the most formats at (64 KiB here, where F16 is timed
    too: 0.2 x 4^g at breaks 1/4; with F16 timed at 4 KiB only, through the 4 KiB point: e_4 (1/4)^g)."""
    cpu = _paged({"Q8_0": 24.0, "F16": 30.0}, {"64KiB": {"Q8_0": 24 / 1.2, "F16": 25.0}, "4KiB": {"Q8_0": 24 / slow_4k}})
    assert cpu.file_page_excess(parse_format("Q8_0"), 2, 1 / 4) == pytest.approx(0.2 * 4 ** g)
    cpu = _paged({"Q8_0": 24.0, "F16": 30.0}, {"64KiB": {"Q8_0": 24 / 1.2}, "4KiB": {"Q8_0": 24 / slow_4k, "F16": 25.0}})
    assert cpu.file_page_excess(parse_format("Q8_0"), 2, 1.0) == pytest.approx(slow_4k - 1)
    assert cpu.file_page_excess(parse_format("Q8_0"), 2, 1 / 4) == pytest.approx((slow_4k - 1) * 0.25 ** g)


def test_a_format_calibrated_at_one_run_length_takes_the_references_exponent():
    """Q4_0 timed at 64 KiB runs only (+10%) takes Q8_0's exponent (1/2): +20% at breaks 1/4; a format not timed from
    files at all (Q4_K, which a quick profile leaves out: its arithmetic hides the breaks) pays none."""
    cpu = _paged({"Q8_0": 24.0, "Q4_0": 11.0, "Q4_K": 18.0},
                 {"64KiB": {"Q8_0": 24 / 1.2, "Q4_0": 10.0}, "4KiB": {"Q8_0": 24 / 1.8}})
    assert cpu.file_page_excess(parse_format("Q4_0"), 2, 1 / 4) == pytest.approx(0.2)
    assert cpu.file_page_excess(parse_format("Q4_K"), 2, 1 / 4) == 0.0


def test_file_page_excess_reads_the_one_thread_rates_on_one_thread():
    """'Q8_0@1t' rates in both tables: one thread's excess is its own (+25% at 64 KiB runs, +100% at 4 KiB)."""
    cpu = _paged({"Q8_0": 24.0, "Q8_0@1t": 22.0},
                 {"64KiB": {"Q8_0": 20.0, "Q8_0@1t": 17.6}, "4KiB": {"Q8_0": 16.0, "Q8_0@1t": 11.0}})
    assert cpu.file_page_excess(parse_format("Q8_0"), 1, 1.0) == pytest.approx(1.0)
    assert cpu.file_page_excess(parse_format("Q8_0"), 1, 1 / 16) == pytest.approx(0.25)


def test_no_file_runs_table_means_no_excess():
    """A profile calibrated before page layouts were timed: the file's layout changes nothing."""
    assert _cpu(Q8_0=30.0, default=20.0).file_page_excess(parse_format("Q8_0"), 2, 0.5) == 0.0


def test_the_executors_excess_reads_its_kernel_rates_and_their_file_tables():
    """kernel=True: the executor's kernel, expert_gbs against kernel_file_runs_gbs (Q8_0 24 GB/s, 24 / 1.1 from 64 KiB
    runs, 24 / 1.4 from 4 KiB runs: its own exponent ln 4 / ln 16 = 1/2, +20% at breaks 1/4); llama.cpp's rowwise
    tables (+20% / +80% here) do not enter it, nor its into theirs."""
    fig = lambda t: {k: Figure(v, "measured", "test") for k, v in t.items()}  # noqa: E731
    cpu = _paged({"Q8_0": 24.0}, {"64KiB": {"Q8_0": 24 / 1.2}, "4KiB": {"Q8_0": 24 / 1.8}}).model_copy(update={
        "expert_gbs": fig({"Q8_0": 24.0, "default": 20.0}),
        "kernel_file_runs_gbs": {"64KiB": fig({"Q8_0": 24 / 1.1}), "4KiB": fig({"Q8_0": 24 / 1.4})}})
    q8 = parse_format("Q8_0")
    assert cpu.file_page_excess(q8, 2, 1.0, kernel=True) == pytest.approx(0.4)
    assert cpu.file_page_excess(q8, 2, 1 / 4, kernel=True) == pytest.approx(0.2)
    assert cpu.file_page_excess(q8, 2, 1.0) == pytest.approx(0.8)
    assert _paged({"Q8_0": 24.0}, {"64KiB": {"Q8_0": 20.0}}).file_page_excess(q8, 2, 1.0, kernel=True) == 0.0


def test_the_executors_excess_on_several_threads_is_its_whole_expert_jobs():
    """On several threads the executor's decode jobs run whole experts per thread (whole_gbs: Q8_0 40 GB/s), and
    calibrate times that job from files there: 40 / 1.5 from 4 KiB runs is +50%, against whole_gbs, not against the
    rows' 24; on one thread its rows (expert_gbs 'Q8_0@1t' 20, 20 / 1.25 from files: +25%)."""
    fig = lambda t: {k: Figure(v, "measured", "test") for k, v in t.items()}  # noqa: E731
    cpu = _cpu(Q8_0=24.0, default=20.0).model_copy(update={
        "expert_gbs": fig({"Q8_0": 24.0, "Q8_0@1t": 20.0, "default": 20.0}), "whole_gbs": fig({"Q8_0": 40.0}),
        "kernel_file_runs_gbs": {"4KiB": fig({"Q8_0": 40 / 1.5, "Q8_0@1t": 20 / 1.25})}})
    q8 = parse_format("Q8_0")
    assert cpu.file_page_excess(q8, 2, 1.0, kernel=True) == pytest.approx(0.5)
    assert cpu.file_page_excess(q8, 1, 1.0, kernel=True) == pytest.approx(0.25)


def test_a_reference_from_2_mib_folios_is_the_contiguous_rate():
    """A '2048KiB' table (the same pool from a file in 2 MiB folios, timed beside the short runs) is the contiguous rate
    the excess is against, not the job's rate in anonymous memory: Q8_0 30 GB/s from folios, 20 from 4 KiB runs: +50%,
    whatever whole_gbs (60) or expert_gbs say; a format without a reference falls back to them."""
    fig = lambda t: {k: Figure(v, "measured", "test") for k, v in t.items()}  # noqa: E731
    cpu = _cpu(Q8_0=24.0, default=20.0).model_copy(update={
        "expert_gbs": fig({"Q8_0": 24.0, "F16": 24.0, "default": 20.0}), "whole_gbs": fig({"Q8_0": 60.0}),
        "kernel_file_runs_gbs": {"2048KiB": fig({"Q8_0": 30.0}), "4KiB": fig({"Q8_0": 20.0, "F16": 20.0})}})
    assert cpu.file_page_excess(parse_format("Q8_0"), 2, 1.0, kernel=True) == pytest.approx(0.5)
    assert cpu.file_page_excess(parse_format("F16"), 2, 1.0, kernel=True) == pytest.approx(0.2)


def test_breaks_up_to_the_references_own_cost_nothing():
    """The reference file in 2 MiB folios has a break at each folio's end (1/512 of its boundaries): a file with as few
    costs nothing, and the breaks beyond count from there: +50% at every boundary a break, +50% x ((1/2 - 1/512) /
    (1 - 1/512))^(1/2) at half of them (the exponent 1/2 where no format has two points)."""
    fig = lambda t: {k: Figure(v, "measured", "test") for k, v in t.items()}  # noqa: E731
    cpu = _cpu(Q8_0=24.0, default=20.0).model_copy(update={
        "kernel_file_runs_gbs": {"2048KiB": fig({"Q8_0": 30.0}), "4KiB": fig({"Q8_0": 20.0})}})
    q8, r = parse_format("Q8_0"), 1 / 512
    assert cpu.file_page_excess(q8, 2, r, kernel=True) == 0.0
    assert cpu.file_page_excess(q8, 2, 0.001, kernel=True) == 0.0
    assert cpu.file_page_excess(q8, 2, 0.5, kernel=True) == pytest.approx(0.5 * ((0.5 - r) / (1 - r)) ** 0.5)
