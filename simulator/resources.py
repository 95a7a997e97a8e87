"""The machine as simulated resources: GPU compute stream, copy engine, PCIe H2D, DDR pool, CPU
cores, NVMe; and the calibrated constants shared by the event simulation and the screen.

Every transfer that touches system memory also crosses the DDR link, so CPU expert reads,
zero-copy reads, DMA copies and page-cache fills contend there (fluid sharing).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .engine import FluidNet, Pool, Serial, Sim

GB = 1e9


@dataclass(frozen=True)
class Constants:
    """Overhead and efficiency constants; `hw.constants` overrides each by name (fitted ones)."""

    zc_efficiency: float = 1.0  # fraction of pcie.zero_copy_gbs a decode zero-copy read attains
    handover_ms: float = 0.0  # GPU->CPU->GPU synchronisation per layer with CPU expert work, ms
    step_overhead_ms: float = 0.0  # per decode step (sampling, graph launch), ms
    gpu_bw_efficiency: float = 1.0  # fraction of VRAM bandwidth for dense reads (7.4 ms is an upper estimate)
    # GPU expert GEMV: dsv41-flash-offload's t_hit = 0.03 ms per 13.27 MB expert = 442 GB/s = 47% of
    # the 3090's 936 GB/s (reported constant, not fitted); used for every GPU-resident expert.
    gpu_expert_efficiency: float = 0.47
    gemm_efficiency: float = 0.30  # fraction of fp16_tflops prefill GEMMs attain (assumed, see README)
    cpu_prefill_gflops_per_core: float = 50.0  # CPU prefill expert GEMM rate per core, GFLOP/s (assumed)

    @classmethod
    def from_hw(cls, hw, **override) -> "Constants":
        """Defaults, then the profile's fitted `constants`, then explicit overrides."""
        vals = {f.name: hw.constant(f.name, getattr(cls(), f.name)) for f in fields(cls)}
        vals.update(override)
        return cls(**vals)


class Machine:
    """One machine's resources inside a `Sim`, sized from a HardwareSpec and a Plan."""

    def __init__(self, sim: Sim, model, hw, plan, consts: Constants):
        self.sim, self.model, self.hw, self.c = sim, model, hw, consts
        self.net = FluidNet(sim)
        self.threads = int(plan.cpu_threads or hw.cpu.threads_used)
        self.has_gpu = hw.gpu is not None
        self.gpu = Serial(sim, "gpu")
        self.copy = Serial(sim, "copy_engine")
        self.cpu = Pool(sim, "cpu", self.threads)
        pcie = hw.pcie
        self.pcie = self.net.link("pcie_h2d", (pcie.h2d_gbs if pcie else 1.0) * GB)
        self.ddr = self.net.link("ddr", hw.memory.usable_gbs * GB)
        self.nvme = self.net.link("nvme", hw.nvme.seq_read_gbs * GB)
        self.zc_rate = (pcie.zero_copy_gbs if pcie else 1.0) * GB * consts.zc_efficiency
        self.h2d_rate = (pcie.h2d_gbs if pcie else 1.0) * GB
        scale = self.threads / hw.cpu.threads_used
        self.cpu_expert_rate = hw.cpu.expert_gbs_for(model.fmt_experts) * GB * scale
        from specs.formats import parse_format
        self.cpu_dense_rate = hw.cpu.expert_gbs_for(parse_format(model.dense_format)) * GB * scale
        self.gpu_bw = (hw.gpu.bw_gbs * GB * consts.gpu_bw_efficiency) if self.has_gpu else 0.0
        self.gpu_flops = (hw.gpu.fp16_tflops * 1e12 * consts.gemm_efficiency) if self.has_gpu else 0.0
        self.rand_rate = hw.nvme.rand_4k_iops * hw.page_bytes
        self.moved = {"gpu": 0.0, "copy_engine": 0.0, "cpu": 0.0}  # bytes each engine processed
        self.nvme_latency = hw.nvme.latency_us * 1e-6

    # ---- transfers and jobs (sizes in bytes, done() when finished) --------------------------
    def zero_copy(self, nbytes: float, done) -> None:
        """GPU kernel reading mapped host memory: crosses PCIe and DDR."""
        self.net.start(nbytes, (self.pcie, self.ddr), done, cap=self.zc_rate, name="zero-copy")

    def dma(self, nbytes: float, done=None) -> None:
        """Copy-engine H2D copy from pinned RAM (FIFO on the copy engine)."""
        self.moved["copy_engine"] += nbytes
        def go():
            self.net.start(nbytes, (self.pcie, self.ddr), lambda: self._dma_end(done),
                           cap=self.h2d_rate, name="dma")
        self.copy.acquire(go)

    def _dma_end(self, done) -> None:
        self.copy.release()
        if done is not None:
            done()

    def cpu_read(self, nbytes: float, done, rate: float | None = None) -> None:
        """All CPU threads compute over `nbytes` of weights in DDR (each core capped by its
        arithmetic rate, all of them by their DDR share)."""
        rate = self.cpu_expert_rate if rate is None else rate
        threads = self.threads
        self.moved["cpu"] += nbytes

        def go():
            self.net.start(nbytes, (self.ddr,), lambda: self._cpu_end(done), cap=rate,
                           weight=threads, name="cpu")
        self.cpu.acquire(threads, go)

    def _cpu_end(self, done) -> None:
        self.cpu.release(self.threads)
        done()

    def nvme_read(self, nbytes: float, done, random: bool = False) -> None:
        """Read from NVMe into the page cache (fills cross DDR); random 4 KiB reads are IOPS-capped."""
        cap = self.rand_rate if random else self.hw.nvme.seq_read_gbs * GB
        self.sim.after(self.nvme_latency, lambda: self.net.start(
            nbytes, (self.nvme, self.ddr), done, cap=cap, name="nvme"))

    def gpu_read_s(self, nbytes: float) -> float:
        """Seconds for the GPU to stream `nbytes` of weights from VRAM."""
        self.moved["gpu"] += nbytes
        return nbytes / self.gpu_bw if self.gpu_bw else 0.0

    def gpu_expert_s(self, nbytes: float) -> float:
        """Seconds for the GPU to run experts of `nbytes` resident in VRAM (GEMV efficiency)."""
        self.moved["gpu"] += nbytes
        return nbytes / (self.gpu_bw * self.c.gpu_expert_efficiency) if self.gpu_bw else 0.0

    def gpu_flops_s(self, flops: float) -> float:
        """Seconds for `flops` of fp16 GEMM work on the GPU."""
        return flops / self.gpu_flops if self.gpu_flops else 0.0

    # ---- results ------------------------------------------------------------------------------
    def report(self, elapsed_s: float) -> dict:
        """{name: {busy_fraction, bytes}} over `elapsed_s` seconds."""
        el = max(elapsed_s, 1e-12)
        out = {name: {"busy_fraction": min(1.0, srv.busy_s / el), "bytes": self.moved[name]}
               for name, srv in (("gpu", self.gpu), ("copy_engine", self.copy), ("cpu", self.cpu))}
        for ln in (self.pcie, self.ddr, self.nvme):
            out[ln.name] = {"busy_fraction": min(1.0, ln.busy_s / el), "bytes": ln.bytes}
        return out
