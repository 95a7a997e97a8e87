"""`moe-offload`: argument parsing and dispatch only. Bad input -> one line on stderr, exit 2.

Each command imports its package lazily, so `plan` never loads torch or numba.
"""
from __future__ import annotations

import argparse
import json
import sys

from specs.errors import SpecError


def _cmd_plan(a) -> int:
    from planner.predict import predict, simulate_plan
    from planner.search import base_plan, search
    from planner.whatif import explain
    from planner.summary import pareto_rows, plan_summary
    from specs.loaders import load_model, output_file

    hw, model = _hw(a.hw), load_model(a.model)
    if a.out:
        output_file(a.out)
    breaks = _page_breaks(a) or 0.0
    if a.engine:  # that engine's default plan, sized to the machine
        plan = base_plan(model, hw, context=a.context, engine=a.engine, page_breaks=breaks)
        pred = simulate_plan(model, hw, plan, prompt_tokens=a.prompt_tokens)
    else:
        plan, pred, _, front = search(model, hw, "ttft" if a.objective == "ttft" else "decode", context=a.context,
                                      prompt_tokens=a.prompt_tokens, top=a.simulate_top,
                                      progress=not a.json and sys.stderr.isatty(), page_breaks=breaks)
    summary = plan_summary(model, hw, plan, pred)
    if not a.engine and a.objective == "pareto":
        summary["pareto"] = pareto_rows(front)
    summary["what_ifs"] = explain(model, hw, plan, predict, a.prompt_tokens)
    if a.emit == "llamacpp":
        from planner.llamacpp import closest_static, emit
        static, lost = closest_static(plan, model)
        summary["llamacpp"] = {"command": emit(plan, model, a.model if a.model.endswith(".gguf") else "MODEL.gguf").command,
                               "cannot_express": lost, "closest_static_plan": static.model_dump(mode="json"),
                               "closest_static_predicted": predict(model, hw, static, a.prompt_tokens).to_dict()}
    if a.out:
        from specs.loaders import dump_plan, write_atomic
        write_atomic(a.out, dump_plan(plan))
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        from reports.tables import render_plan_report
        render_plan_report(summary)
        if a.out:
            print(f"plan written to {a.out}")
    return 0


def _memory_map(model, hw, plan, plan_file):
    """specs.memory.memory_map, its errors naming the plan's file (it knows the plan, not where it came from)."""
    from specs.memory import memory_map
    try:
        return memory_map(model, hw, plan)
    except SpecError as e:
        raise SpecError(e.file or plan_file, e.field, e.reason) from None


def _cmd_fit(a) -> int:
    from reports.tables import render_memory_map
    from specs.loaders import load_model, load_plan

    hw, model, plan = _hw(a.hw), load_model(a.model), load_plan(a.plan)
    mm = _memory_map(model, hw, plan, a.plan)
    render_memory_map(mm)
    mm.check_fits(a.plan)
    print(f"{a.plan} fits: {mm.free_slots:,} more expert slots free in VRAM")
    return 0


def _cmd_report(a) -> int:
    from planner.predict import predict
    from planner.search import base_plan
    from planner.summary import plan_summary
    from planner.whatif import sweeps
    from reports.build import plan_report
    from reports.page import write_page
    from specs.loaders import load_model, load_plan, output_folder

    hw, model = _hw(a.hw), load_model(a.model)
    plan = load_plan(a.plan) if a.plan else base_plan(model, hw, context=a.context)
    output_folder(a.out)
    summary = plan_summary(model, hw, plan, predict(model, hw, plan, prompt_tokens=a.prompt_tokens))
    page = plan_report(summary, sweeps(model, hw, plan, predict, a.prompt_tokens))
    md, html = write_page(page, a.out)
    print(f"report written: {md} and {html}")
    return 0


def _cmd_optimize(a) -> int:
    from planner.optimize import compare_models, optimize
    from planner.predict import predict
    from reports.tables import render_options
    from specs.loaders import load_model

    hw = _hw(a.hw)
    if a.models:
        rows = compare_models([load_model(m) for m in a.models.split(",")], hw, a.target_tok_s, predict,
                              a.prompt_tokens, a.context)
        print(json.dumps(rows, indent=2)) if a.json else render_options(rows, a.target_tok_s, models=True)
        return 0
    opts = optimize(load_model(a.model), hw, a.target_tok_s, predict, a.ttft, a.prompt_tokens, a.context)
    rows = [{"change": o.change, "cost_usd": o.cost_usd, "decode_tok_s": o.decode_tok_s, "ttft_s": o.ttft_s,
             "bottleneck": o.bottleneck, "meets": o.meets} for o in opts[: a.top]]
    print(json.dumps(rows, indent=2)) if a.json else render_options(rows, a.target_tok_s)
    return 0


def _cmd_ingest(a) -> int:
    from calibration.ingest import ingest_runs
    from calibration.store import default_store_path

    store = a.store or default_store_path()
    rows = ingest_runs(a.files, a.model, a.flags, store, timings=a.timings, page_breaks=a.page_breaks)
    for r in rows:
        cold = "; its first repetition read from disk, left out" if r["cold_reps"] else ""
        print(f"{r['case']}: {r['metric']} = {float(r['value']):.2f}  ({r['flags']}){cold}")
    print(f"{len(rows)} measured runs appended to {store}")
    return 0


def _cmd_regress(a) -> int:
    from calibration import regress
    from calibration.store import check_store, default_store_path

    store = a.store or default_store_path()
    if a.local_only and not a.hw and not a.measure:  # with --measure it measures and stores, checking nothing
        raise SpecError(None, "--local-only", "needs --hw (this machine's calibrated profile) to check the store's runs")
    if a.store and not a.measure:  # a store named but absent, or not a store, is said, not read as empty
        check_store(store)
    if a.hw:
        _hw(a.hw)  # a bad profile is one line even when the store holds no local runs
    if a.measure:
        from calibration.local import measure_local
        measure_local(a.preset, store_path=store, rounds=a.rounds, log=lambda s: print(s, file=sys.stderr))
    rows = [] if a.local_only else regress.published_rows(a.case)
    if a.hw and store.exists():
        rows += regress.local_rows(store, a.hw)
    if a.local_only and a.hw and not rows:
        raise SpecError(str(store), None, "no executor or llama.cpp runs with a plan to check (ingest or "
                                          "`regress --measure` add them)")
    if a.json:
        print(regress.to_json(rows))
    else:
        from reports.tables import render_regress
        render_regress(rows, regress.summary(rows))
    return 0 if all(r["ok"] for r in rows) else 1


def _cmd_hw(a) -> int:
    from calibration.detect import describe
    from reports.tables import render_provenance

    hw = _hw(a.hw, measure=a.measure)
    if a.save:
        from specs.loaders import dump_hardware, write_atomic
        write_atomic(a.save, dump_hardware(hw))
    if a.json:
        print(json.dumps(hw.to_yaml_dict(), indent=2))
    else:
        render_provenance(describe(hw), hw.name)
        if a.save:
            print(f"profile written to {a.save}")
    return 0


def _cmd_calibrate(a) -> int:
    if a.gemm_int8:  # the int8 build's kernels measured: a profile that predicts `execute --gemm-int8`
        _int8_build()
    from calibration.calibrate import calibrate
    from specs.loaders import load_hardware

    base = load_hardware(a.hw_base) if a.hw_base else None
    if a.from_runs:
        return _calibrate_from_runs(a)
    if a.from_trace:
        from calibration.trace_profile import calibrate_from_traces
        if base is None or not a.model:
            raise SpecError("calibrate", "--hw-base" if base is None else "--model",
                            "--from-trace needs --hw-base (a measured profile) and --model (the traces' GGUF)")
        hw, _, _ = calibrate_from_traces(a.from_trace, a.model, base, out=a.out)
        print(f"fitted profile {hw.name} written to {a.out}")
        return 0
    hw = calibrate(quick=a.quick, out=a.out, hw_base=base, progress=sys.stderr.isatty(), store_path=a.store,
                   typical_out=a.typical_out, ggml_lib=a.ggml_lib)
    print(f"calibrated profile {hw.name} written to {a.out}"
          + (f"; its typical state (median rounds) to {a.typical_out}" if a.typical_out else ""))
    return 0


def _calibrate_from_runs(a) -> int:
    from calibration.run_fit import calibrate_from_runs, median_abs
    from calibration.store import default_store_path
    from reports.tables import render_loo
    from specs.loaders import load_model

    if not (a.hw_base and a.model):
        raise SpecError(None, "--from-runs", "needs --hw-base (the machine's profile) and --model (the runs' model)")
    _, rows, values = calibrate_from_runs(a.store or default_store_path(), a.model, _hw(a.hw_base),
                                          load_model(a.model), a.out)
    render_loo(rows, median_abs(rows, "unfitted_error"), median_abs(rows, "loo_error"), values)
    print(f"fitted profile written to {a.out}")
    return 0


def _cmd_make_model(a) -> int:
    from executor.make_model import make_model

    try:
        path = make_model(a.preset, a.out, seed=a.seed, engram=a.engram)
    except ValueError as e:
        raise SpecError(None, "--preset", str(e)) from None
    print(f"wrote {path} ({path.stat().st_size / 2**20:,.1f} MiB)")
    return 0


def _int8_build() -> None:
    """Select the executor's int8 build (--gemm-int8) before its kernels load: MOE_OFFLOAD_GEMM_INT8=1, read where they
    load (executor.qgemm.INT8) and compiled into them as a constant; one clear line if they already loaded without."""
    loaded = sys.modules.get("executor.qgemm")
    if loaded is not None and not loaded.INT8:
        raise SpecError(None, "--gemm-int8", "the executor's kernels are already loaded in this process without "
                        "it; set MOE_OFFLOAD_GEMM_INT8=1 before they load")
    import os
    os.environ["MOE_OFFLOAD_GEMM_INT8"] = "1"


def _cmd_execute(a) -> int:
    if a.gemm_int8:
        _int8_build()
    from executor.runner import execute
    from specs.loaders import load_plan, output_file

    plan = load_plan(a.plan)
    hw = _hw(a.hw) if a.hw else None  # bad input is found before the run, not after it
    if a.trace:
        output_file(a.trace)
    if a.streams:
        plan = plan.model_copy(update={"streams": a.streams})
    try:
        r = execute(plan, a.model, prompt_tokens=a.prompt_tokens, gen_tokens=a.gen_tokens, trace_path=a.trace,
                    progress=not a.json and sys.stderr.isatty(), warmup=not a.no_warmup)
    except SpecError as e:  # the executor names the plan "plan": give the user its file
        raise SpecError(a.plan if e.file == "plan" else e.file, e.field, e.reason) from None
    from calibration.page_layout import page_breaks_of  # the file's page layout the run read (null: unreadable)
    r["model_page_breaks"] = page_breaks_of("auto", a.model)
    if a.hw:  # the bandwidth each tier achieved beside the simulator's roof for it, and its prediction
        from calibration.regress import run_against_model
        r.update(run_against_model(r, plan, a.model, hw))
    if a.json:
        print(json.dumps({k: v for k, v in r.items() if k != "logits"}, indent=2, default=str))
    else:
        from reports.tables import render_execution
        render_execution(r)
    return 0


def _cmd_schema(a) -> int:
    from specs.hardware import HardwareSpec
    from specs.model import ModelSpec
    from specs.plan import Plan

    cls = {"plan": Plan, "hardware": HardwareSpec, "model": ModelSpec}[a.what]
    print(json.dumps(cls.model_json_schema(), indent=2))
    return 0


def _cmd_list(a) -> int:
    from specs.loaders import builtin_hardware, builtin_models

    print("hardware profiles: " + ", ".join(builtin_hardware()))
    print("model presets:     " + ", ".join(builtin_models()))
    return 0


def _hw(ref: str, measure: bool = False):
    """A hardware profile: a YAML path, a built-in name, or `auto` (detected on this machine)."""
    if ref == "auto":
        from calibration.detect import detect_hardware
        return detect_hardware(measure=measure)
    from specs.loaders import load_hardware
    return load_hardware(ref)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _cmd_simulate(a) -> int:
    from planner.search import base_plan
    from simulator.run import simulate
    from specs.loaders import load_model, load_plan

    hw, model = _hw(a.hw), load_model(a.model)
    plan = load_plan(a.plan) if a.plan else base_plan(model, hw, context=a.context, engine=a.engine)
    if a.page_breaks is not None:
        plan = plan.model_copy(update={"cpu_file_page_breaks": _page_breaks(a) or 0.0})
    _memory_map(model, hw, plan, a.plan).check_fits(a.plan)
    r = simulate(model, hw, plan, prompt_tokens=a.prompt_tokens, gen_tokens=a.gen_tokens,
                 streams=a.streams, seed=a.seed, routing=a.routing, engram_text=a.engram_text)
    if a.json:
        print(json.dumps(r.to_dict(), indent=2))
    else:
        from reports.tables import render_sim_result
        render_sim_result(r.to_dict(), f"{model.name} on {hw.name}, {plan.engine} plan")
    return 0


def _page_breaks(a) -> float | None:
    """--page-breaks: the GGUF's page layout in the page cache (calibration.page_layout), a number or read from
    --model's file ('auto'; a line on stderr where it cannot be read: taken as contiguous); None where not given."""
    if a.page_breaks is None:
        return None
    from calibration.page_layout import page_breaks_of
    b = page_breaks_of(a.page_breaks, a.model if a.model.endswith(".gguf") else "")
    if b is None:
        print(f"moe-offload: --page-breaks auto: no page layout of {a.model} to read (a GGUF, half of it in the "
              f"page cache, and root are needed): taken as contiguous", file=sys.stderr)
    return b


def _page_breaks_flag(p: argparse.ArgumentParser) -> None:
    """--page-breaks, as plan and simulate take it."""
    p.add_argument("--page-breaks", default=None,
                   help="the share of the GGUF's page boundaries that are physical breaks in the page cache (the "
                        "plan's cpu_file_page_breaks: what llama.cpp's in-place weights and the executor's pay), or "
                        "'auto' to read it from --model's file (root)")


def _hw_and_model(p: argparse.ArgumentParser) -> None:
    """--hw and --model, as every command that predicts takes them."""
    p.add_argument("--hw", required=True, help="hardware profile: YAML path, built-in name or `auto`")
    p.add_argument("--model", default="deepseek-v4.1-flash", help="preset name, config.json or .gguf")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="moe-offload", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="choose a placement and print the ceiling report")
    _hw_and_model(p)
    p.add_argument("--objective", choices=["decode", "ttft", "pareto"], default="decode",
                   help="pareto: also list the plans no other beats on both decode and TTFT")
    p.add_argument("--context", type=int, default=None, help="KV context to reserve (tokens)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length for TTFT (tokens)")
    p.add_argument("--engine", choices=["llamacpp", "tiered-cache", "strata", "custom"], default=None,
                   help="take this engine's default plan instead of searching")
    p.add_argument("--simulate-top", type=int, default=2, help="screened candidates to simulate")
    p.add_argument("--out", help="write the chosen plan JSON here")
    p.add_argument("--emit", choices=["llamacpp"], help="also give the equivalent llama-server command")
    _page_breaks_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("simulate", help="simulate prefill and decode of a plan (discrete events)")
    _hw_and_model(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--plan", help="plan JSON file")
    g.add_argument("--engine", choices=["llamacpp", "tiered-cache", "strata", "custom"],
                   help="an engine's default plan, sized to the machine")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--streams", type=int, default=None)
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--routing", default=None, help="uniform, fitted, drifting, skewed:EXP or a trace .jsonl")
    p.add_argument("--engram-text", choices=["seen", "new", "shared"], default="seen",
                   help="Engram rows of the request's text: seen before (cached as far as RAM allows) or new (cold)")
    p.add_argument("--seed", type=int, default=0)
    _page_breaks_flag(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("fit", help="check that a plan fits in VRAM, RAM and on the drive (memory map)")
    _hw_and_model(p)
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.set_defaults(func=_cmd_fit)

    p = sub.add_parser("report", help="write a Markdown and HTML report with figures")
    _hw_and_model(p)
    p.add_argument("--plan", help="plan JSON (default: the planner's choice)")
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("optimize", help="the cheapest change that meets a target speed")
    _hw_and_model(p)
    p.add_argument("--models", help="comma-separated models: which meets the target on this machine")
    p.add_argument("--target-tok-s", type=float, required=True, help="decode target (tok/s)")
    p.add_argument("--ttft", type=float, default=None, help="TTFT target (s)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--top", type=int, default=10, help="rows to show")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_optimize)

    p = sub.add_parser("ingest", help="add llama-bench / llama-server runs to the results store")
    p.add_argument("files", nargs="+", help="llama-bench output (json, jsonl, csv, md) or server logs")
    p.add_argument("--model", required=True, help="the GGUF (header read) or preset the runs used")
    p.add_argument("--flags", default="", help="llama.cpp flags not in the output (Markdown, logs)")
    p.add_argument("--timings", action="store_true", help="files are llama-server/llama-cli logs")
    p.add_argument("--page-breaks", default="auto",
                   help="the share of the GGUF's page boundaries that were physical breaks in the page cache during "
                        "the runs (0: contiguous), or 'auto' (default) to read it now from the file the output names "
                        "(needs root; ingest right after the runs: the page cache moves)")
    p.add_argument("--store", help="results store CSV (default: $MOE_OFFLOAD_RESULTS or runs/results.csv)")
    p.set_defaults(func=_cmd_ingest)

    p = sub.add_parser("regress", help="predicted against measured for every case; exit 1 on drift")
    p.add_argument("--case", action="append", help="only cases whose name starts with this (repeatable)")
    p.add_argument("--hw", help="this machine's calibrated profile, to check the store's local runs")
    p.add_argument("--store", type=__import__("pathlib").Path, help="results store CSV")
    p.add_argument("--local-only", action="store_true", help="skip the published cases")
    p.add_argument("--measure", action="store_true", help="re-run the local executor cases first")
    p.add_argument("--preset", default="small", help="with --measure: the synthetic model (small, tiny)")
    p.add_argument("--rounds", type=int, default=3, help="with --measure: runs per case (median kept)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_regress)

    p = sub.add_parser("hw", help="show a hardware profile with the provenance of every figure")
    p.add_argument("--hw", required=True, help="a profile, or `auto` to detect this machine")
    p.add_argument("--measure", action="store_true", help="with auto: fill bandwidths from a quick calibration")
    p.add_argument("--save", help="write the profile YAML here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_hw)

    p = sub.add_parser("calibrate", help="measure this machine and write a calibrated profile")
    p.add_argument("--quick", action="store_true", help="about a minute instead of ten")
    p.add_argument("--out", required=True, help="profile YAML to write (atomically)")
    p.add_argument("--typical-out", help="also write the run's typical state here: each CPU kernel's rate from its "
                   "median clean rounds, where --out has its fastest (predicts a run's mean on a machine whose speed "
                   "drifts)")
    p.add_argument("--hw-base", help="merge the measurements over this profile (default: detected)")
    p.add_argument("--store", help="results store CSV")
    p.add_argument("--from-runs", action="store_true",
                   help="fit overheads to the store's measured runs of --model (e.g. ingested llama.cpp runs)")
    p.add_argument("--from-trace", nargs="+", metavar="TRACE", help="fit host overheads from executor traces")
    p.add_argument("--model", help="with --from-trace: the GGUF the traces ran")
    p.add_argument("--ggml-lib", metavar="PATH|auto",
                   help="time llama.cpp's CPU expert kernels on a llama.cpp build's own (its libggml-cpu.so, or the "
                   "folder holding it; 'auto': $MOE_OFFLOAD_GGML_LIB, beside llama-bench / llama-server / llama-cli on "
                   "PATH, or llama-cpp-python's) instead of their rebuilds (the default)")
    p.add_argument("--gemm-int8", action="store_true",
                   help="measure the executor's int8 build (`execute --gemm-int8`'s kernels), so that the profile "
                   "predicts it; its figures name their activations")
    p.set_defaults(func=_cmd_calibrate)

    p = sub.add_parser("make-model", help="write a synthetic MoE GGUF (llama.cpp loads it too)")
    p.add_argument("--preset", required=True, help="tiny, tiny-q8, tiny-k, tiny-k3, tiny-k5, tiny-iq4, small, small-q4, "
                   "small-q2k, small-q3k, small-q4k, small-q5k, small-iq4xs, small-iq4nl (K-quants: -k / -q4k Q4_K / Q6_K "
                   "experts, -k3 Q2_K / Q3_K, -q2k Q2_K, -q3k Q3_K, -k5 / -q5k Q5_K; -iq4 IQ4_XS / IQ4_NL)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engram", action="store_true", help="also write an n-gram table beside it")
    p.set_defaults(func=_cmd_make_model)

    p = sub.add_parser("execute", help="run a plan for real on a GGUF MoE model and trace it")
    p.add_argument("--plan", required=True)
    p.add_argument("--model", required=True, help="the .gguf file")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--streams", type=int, default=None)
    p.add_argument("--trace", help="trace JSONL path (default runs/trace-*.jsonl)")
    p.add_argument("--no-warmup", action="store_true",
                   help="time the cold first prompt: no throwaway run of the same shape before the timed one (by "
                   "default one runs, as llama-bench's warm-up does, and its TTFT is reported as warmup_ttft_s)")
    p.add_argument("--hw", help="a profile of this machine: each tier's roof beside what it achieved, and "
                   "the simulator's prediction of the run")
    p.add_argument("--ggml-lib", metavar="PATH|auto",
                   help="time llama.cpp's CPU expert kernels on a llama.cpp build's own (its libggml-cpu.so, or the "
                   "folder holding it; 'auto': $MOE_OFFLOAD_GGML_LIB, beside llama-bench / llama-server / llama-cli on "
                   "PATH, or llama-cpp-python's) instead of their rebuilds (the default)")
    p.add_argument("--gemm-int8", action="store_true",
                   help="prefill's integer GEMM, and the Q4_0 / IQ4 / K-quant decode rows, on int8 activations, "
                   "llama.cpp's precision (~0.5%% of a product; the default int16 keeps the logits within 1e-3 of an "
                   "fp32 reference): with AVX-512 VNNI about 1.5x the GEMM's rate and 1.15-1.41x those rows', no "
                   "change without")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_execute)

    p = sub.add_parser("schema", help="print the JSON Schema of a file format")
    p.add_argument("what", choices=["plan", "hardware", "model"])
    p.set_defaults(func=_cmd_schema)

    p = sub.add_parser("list", help="list built-in hardware profiles and model presets")
    p.set_defaults(func=_cmd_list)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `moe-offload` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as e:
        print(f"moe-offload: {e.line()}", file=sys.stderr)
        return 2
    except OSError as e:  # a path the user gave that the system refuses (permission, a full disk, ...)
        if e.filename is None:
            raise
        print(f"moe-offload: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("moe-offload: interrupted", file=sys.stderr)
        return 130
