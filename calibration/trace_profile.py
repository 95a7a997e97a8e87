"""A hardware profile from executor traces: the base profile's measured rates, the host constants
trace_fit.fit reads off the traces, and the device the executor ran on (a discrete GPU kept, else
torch on the host's cores as a host-sharing pseudo-GPU), written atomically (`moe-offload
calibrate --from-trace`)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from specs.errors import SpecError
from specs.figure import Figure

from .trace_fit import DEVICE_BYTES_PER_PARAM, HostFit, activations, check_trace, errors, fit, read_trace


def _measured(hw, what: str) -> float:
    """A figure of the base profile the simulator needs measured; SpecError when it is not."""
    obj = hw
    for part in what.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
        if obj is None:
            break
    if obj is None or getattr(obj, "source", "measured") not in ("measured", "derived"):
        raise SpecError(hw.name, what, "not measured on this machine (run `moe-offload calibrate "
                        "--out HW.yaml` and pass it as --hw-base)")
    return float(obj)


def base_rates(hw, model) -> tuple[float, float, float, float]:
    """(dense GB/s, DDR GB/s, handover ms, c_a hint ms) of the base profile, each measured. The dense
    rate is the discrete GPU's VRAM bandwidth where there is one (the executor's dense path runs
    there), else the host kernels' rate for the dense format."""
    discrete = hw.gpu is not None and not hw.gpu.shares_host
    dense = _measured(hw, "gpu.bw_gbs" if discrete else f"cpu.expert_gbs.{model.dense_format}")
    eff = _measured(hw, "memory.efficiency")
    ddr = hw.memory.peak_gbs * eff
    ho = float(hw.constants.get("sync_ms", hw.constants.get("handover_ms", 0.0)))
    ca = float(hw.constants.get(f"c_a_ms.{model.fmt_experts.name}", hw.constants.get("c_a_ms", 0.0)))
    return dense, ddr, ho, ca


def fitted_profile(base, model, f: HostFit, sources: list[str], date: str, acts: str | None = None):
    """`base` with a host-sharing pseudo-GPU (the torch device) and the fitted constants (acts: the traces'
    activations, trace_fit.activations, named in each figure's source)."""
    from specs.hardware import GPU
    ref = f"{date}, calibration/trace_fit.py over {len(sources)} executor trace(s) of {model.name}" \
          + (f" ({acts} activations)" if acts else "") + ": " + ", ".join(Path(s).name for s in sources)
    d = lambda v, how: Figure(float(v), "measured", f"{ref}; {how}")  # noqa: E731
    dev_eb = model.params_per_expert * DEVICE_BYTES_PER_PARAM
    consts = dict(base.constants)
    consts.update(layer_overhead_ms=d(f.layer_overhead_ms, "per-layer rest of t_dense + t_experts, median step"),
                  token_overhead_ms=d(f.token_overhead_ms, "multi-token steps: per-layer rest per further token"),
                  device_layer_ms=d(f.device_layer_ms, "layers with device work: their rest beyond the host's, median"),
                  cpu_job_ms=d(f.cpu_job_ms, "t_cpu = c_a + c_b n over inline CPU jobs"),
                  dev_bytes_per_param=Figure(DEVICE_BYTES_PER_PARAM, "derived", "executor device copies are f32"))
    if f.discrete or f.n.get("overlap_layers"):
        consts.update(overlap_layer_ms=d(f.overlap_layer_ms, "layers with hits beside a CPU job: their rest beyond "
                                         "the host's, median"),
                      overlap_dev_ms=d(f.overlap_dev_ms, "those layers: t_dev beyond hit_ms per hit, median"
                                       if f.discrete else "those layers: t_dev + t_wait beyond hit_ms per hit and "
                                       "c_a + c_b n (the two in turn on the shared cores), median"))
    if f.discrete:
        consts["overlap_cpu_ms"] = d(f.overlap_cpu_ms, "those layers: t_cpu beyond c_a + c_b n, median")
        if f.copy_h2d_gbs:
            consts["copy_h2d_gbs"] = base.constants["pageable_h2d_gbs"]  # measured by calibrate
        if f.n.get("copied_layers"):
            consts["copy_miss_ms"] = d(f.copy_miss_ms, "layers of copied misses only: t_dev per copy beyond its "
                                       "bytes at copy_h2d_gbs and hit_ms, median")
    if f.n.get("engram_records"):  # else the base's value, if any, stands
        consts["engram_row_us"] = d(f.engram_row_us, f"median t_engram_ms / engram_rows over "
                                    f"{f.n['engram_records']} decode records without major faults, in us")
    if "sync_ms" in base.constants:
        consts["handover_ms"] = base.constants["sync_ms"]
    if f.hit_ms:
        consts["dev_expert_gbs"] = d(dev_eb / f.hit_ms / 1e6, f"f32 expert bytes / hit_ms {f.hit_ms:.3f} ms")
    if f.prefill_gflops_per_core:
        # the traces' rate is their model's weight types'; the profile's is the job format's, which the simulator scales
        # by each type's cpu.prefill_format_share: so it is the traces' over the model's mix of those shares
        mix = model.expert_rate(base.cpu.prefill_share_for, per="weights")
        how = "prefill routed FLOPs / t_cpu / threads"
        if mix != 1.0:
            how += f", over the model's mix {mix:.3f} of cpu.prefill_format_share"
        consts["cpu_prefill_gflops_per_core"] = d(f.prefill_gflops_per_core / mix, how)
        if f.prefill_tokens_per_expert:  # the rate's batch size, for cpu_prefill_fixed_tokens (the base's, if any)
            consts["cpu_prefill_ref_tokens"] = d(f.prefill_tokens_per_expert, "prefill (token, expert) products / "
                                                 "experts run, over the same records")
    eg = dict(base.cpu.expert_gbs)
    eg[model.fmt_experts.name] = d(model.expert_bytes / f.cpu_expert_ms / 1e6,
                                   f"expert bytes / c_b {f.cpu_expert_ms:.3f} ms")
    # the traces' jobs give the format its one rate, whole experts or rows split as they ran: its burst rate of
    # whole experts (calibrate's cpu.whole_gbs) no longer stands for the executor's jobs
    wg = {k: v for k, v in base.cpu.whole_gbs.items() if k.split("@")[0] != model.fmt_experts.name}
    cpu = base.cpu.model_copy(update={"expert_gbs": eg, "whole_gbs": wg})
    gpu = base.gpu
    if gpu is not None and not gpu.shares_host and f.host_gemm_gflops:
        # a discrete GPU keeps its datasheet rate; the executor's prefill GEMMs reach this share of it
        consts["gemm_efficiency"] = d(min(1.0, f.host_gemm_gflops / (float(gpu.fp16_tflops) * 1e3)),
                                      f"prefill dense FLOPs / time {f.host_gemm_gflops:.0f} GFLOP/s over "
                                      f"gpu.fp16_tflops {float(gpu.fp16_tflops):.0f}")
    if gpu is None or gpu.shares_host:
        consts["gemm_efficiency"] = Figure(1.0, "derived", "gpu.fp16_tflops is the measured host GEMM rate")
        avail = float(base.memory.capacity_bytes) - float(base.memory.os_reserve_bytes)
        gpu = GPU(name="torch cpu (host-sharing pseudo-GPU)", shares_host=True,
                  vram_bytes=Figure(avail, "derived", "host RAM less the OS reserve"),
                  bw_gbs=consts.get("dev_expert_gbs", Figure(base.memory.usable_gbs, "derived", "DDR")),
                  fp16_tflops=d((f.host_gemm_gflops or 50.0) / 1e3, "prefill dense FLOPs / time"),
                  reserved_bytes=Figure(0.0, "assumed", "none"))
    return base.model_copy(update={"gpu": gpu, "cpu": cpu, "constants": consts,
                                   "notes": (base.notes + f"\ntrace fit: {ref}").strip()})


def calibrate_from_traces(paths: list[str], model_path: str, hw_base, out: str | Path | None = None,
                          log=print) -> tuple[object, HostFit, list[dict]]:
    """Fit on the traces, report errors, write the profile (atomically) to `out` when given."""
    from specs.loaders import dump_hardware, load_model, write_atomic
    from .sampling import today
    model = load_model(model_path)
    traces = {}
    for p in paths:
        recs = read_trace(p)
        check_trace(recs, model, p)
        traces[str(p)] = recs
    acts = activations(traces)
    dense, ddr, ho, ca = base_rates(hw_base, model)
    discrete = hw_base.gpu is not None and not hw_base.gpu.shares_host
    copy = float(hw_base.constants.get("pageable_h2d_gbs", 0.0)) if discrete else 0.0
    f = fit(traces, model, dense, hw_base.cpu.threads_used, ca, discrete, copy)
    errs = errors(traces, model, dense, ddr, hw_base.cpu.threads_used, ho, ca, discrete, copy)
    hw = fitted_profile(hw_base, model, f, list(traces), today(), acts)
    if out is not None:
        write_atomic(out, dump_hardware(hw))
    if log:
        log("fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in asdict(f).items() if isinstance(v, float)))
        for e in errs:
            fmt = lambda x: "-" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
            log(f"  {Path(e['trace']).name:40s} in-sample {fmt(e['in_sample']):>7s}  "
                f"leave-one-out {fmt(e['out_of_sample']):>7s}")
    return hw, f, errs
