"""The memory map of a plan: bytes per tier (VRAM, RAM, NVMe), cache slots and KV tokens that fit."""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SpecError
from .formats import llamacpp_repacks, parse_format
from .hardware import HardwareSpec
from .model import ModelSpec
from .plan import Plan

GIB = 2**30
REPACKED = "experts (repacked at load)"  # RAM part of a plan whose engine copies CPU experts at load
LOADED = "experts (read into RAM at load)"  # the same without the mmap (llama.cpp's --no-mmap)


@dataclass(frozen=True)
class MemoryMap:
    """Bytes each tensor group takes in each tier, and what is left."""

    vram: dict[str, float] = field(default_factory=dict)
    ram: dict[str, float] = field(default_factory=dict)
    nvme: dict[str, float] = field(default_factory=dict)
    card: dict[str, float] = field(default_factory=dict)  # a second card's (hw.expert_device): its expert slots
    vram_capacity: float = 0.0
    ram_capacity: float = 0.0
    nvme_capacity: float = 0.0
    expert_bytes: float = 0.0
    kv_bytes_per_token: float = 0.0

    @property
    def vram_used(self) -> float:
        return sum(self.vram.values())

    @property
    def ram_used(self) -> float:
        return sum(self.ram.values())

    @property
    def vram_free(self) -> float:
        """VRAM bytes left after everything the plan places there."""
        return self.vram_capacity - self.vram_used

    @property
    def free_slots(self) -> int:
        """Further experts the free VRAM would hold as cache slots."""
        return max(0, int(self.vram_free // self.expert_bytes))

    @property
    def kv_tokens_fit(self) -> int:
        """Context tokens whose KV fits in the VRAM the plan gives KV plus what is free."""
        if not self.kv_bytes_per_token:
            return 0
        kv = self.vram.get("kv cache", 0.0) + max(0.0, self.vram_free)
        return int(kv // self.kv_bytes_per_token)

    def check_fits(self, plan_file: str | None = None) -> None:
        """Raise a SpecError with the byte accounting when VRAM, RAM or NVMe is over-committed."""
        for tier, parts, cap in (("VRAM", self.vram, self.vram_capacity), ("RAM", self.ram, self.ram_capacity),
                                 ("NVMe", self.nvme, self.nvme_capacity)):
            used = sum(parts.values())
            if used > cap:
                detail = " + ".join(f"{k} {v / GIB:.2f}" for k, v in parts.items() if v)
                hint = ("; llama.cpp's --no-repack leaves them in the mmap, to be read from NVMe"
                        if parts.get(REPACKED) else "; without --no-mmap they stay in the mmap, to be read from NVMe"
                        if parts.get(LOADED) else "")
                raise SpecError(plan_file, tier.lower(), f"plan does not fit in {tier}: {detail} = "
                                f"{used / GIB:.2f} GiB > {cap / GIB:.2f} GiB{hint}")


def repacked_bytes(model: ModelSpec, isa: list[str], group: str = "experts") -> float:
    """Bytes of `model`'s `group` tensors ("experts" or "dense") llama.cpp copies into its CPU_REPACK
    buffer on a CPU with `isa`: per tensor for a GGUF header (a repacked type, rows a multiple of 8:
    ggml's condition), else the expert or dense format's for all of them."""
    if model.tensors:
        by_type: dict[str, bool] = {}  # one decision per type, not per tensor (a GGUF has thousands)
        total = 0.0
        for t in model.tensors:
            if t.group == group and len(t.shape) > 1 and t.shape[1] % 8 == 0:
                if t.type not in by_type:
                    by_type[t.type] = llamacpp_repacks(parse_format(t.type), isa)
                total += t.bytes if by_type[t.type] else 0
        return total
    if group == "experts":
        return model.routed_bytes if llamacpp_repacks(model.fmt_experts, isa) else 0.0
    dense = model.dense_resident_bytes - model.embedding_bytes  # the embedding table is read by row, not repacked
    return dense if llamacpp_repacks(parse_format(model.dense_format), isa) else 0.0


def check_device_tier(model: ModelSpec, hw: HardwareSpec, plan: Plan) -> None:
    """A second card's expert slots must have a card (hw.expert_device) and fit in what it leaves free."""
    slots = plan.device_tier.slots
    if not slots:
        return
    dev = hw.expert_device
    if dev is None:
        raise SpecError(None, "device_tier.slots", f"hardware {hw.name} has no expert_device to hold {slots} experts "
                                                   "(add one: --hw BASE+DEVICE, e.g. epyc8ch-3090+arc-pro-b70)")
    free = dev.free_bytes
    if slots * model.expert_bytes > free:
        raise SpecError(None, "device_tier.slots", f"{slots} slots of {model.expert_bytes / 1e6:.2f} MB need "
                        f"{slots * model.expert_bytes / 1e9:.2f} GB; {dev.name} has {free / 1e9:.2f} GB free "
                        f"(at most {int(free // model.expert_bytes)} slots)")


def memory_map(model: ModelSpec, hw: HardwareSpec, plan: Plan) -> MemoryMap:
    """Where each byte of `model` lives under `plan` on `hw` (VRAM, RAM, NVMe, in bytes)."""
    p = plan.placement
    kv_tok = model.kv_bytes_per_token(plan.kv.dtype)
    kv_bytes = kv_tok * plan.kv.context
    bad = [layer for layer in p.gpu_expert_layers if layer not in set(model.layers_moe)]
    if bad:
        raise SpecError(None, "placement.gpu_expert_layers", f"layers {bad} are not MoE layers of {model.name}")
    check_device_tier(model, hw, plan)
    per_layer = model.routed_bytes / model.n_moe_layers
    static_gpu = per_layer * len(p.gpu_expert_layers)
    cpu_side = model.routed_bytes - static_gpu
    if p.experts_home == "gpu":
        static_gpu, cpu_side = model.routed_bytes, 0.0

    vram: dict[str, float] = {}
    if hw.gpu is not None:
        vram["reserved"] = float(hw.gpu.reserved_bytes)
        vram["workspace"] = float(plan.gpu_workspace_bytes)
        if p.dense == "gpu":
            vram["dense path"] = model.dense_resident_bytes
        if p.kv == "gpu":
            vram["kv cache"] = kv_bytes
        vram["static experts"] = static_gpu
        vram["expert cache"] = plan.expert_cache.slots * model.expert_bytes
        if p.engram == "gpu":
            vram["engram"] = model.engram_table_bytes
    elif p.dense == "gpu" or p.kv == "gpu" or static_gpu or plan.expert_cache.slots or p.engram == "gpu":
        raise SpecError(None, "placement", f"hardware {hw.name} has no GPU but the plan puts weights in VRAM")

    ram: dict[str, float] = {"os reserve": float(hw.memory.os_reserve_bytes)}
    if p.dense == "cpu":
        ram["dense path"] = model.dense_resident_bytes
    if p.kv == "cpu":
        ram["kv cache"] = kv_bytes
    if p.engram == "ram":
        ram["engram"] = model.engram_table_bytes
    nvme: dict[str, float] = {}
    if cpu_side and not plan.cpu_mmap:  # read into anonymous buffers at load: nothing streams from NVMe
        ram[LOADED] = cpu_side
        cpu_side = 0.0
    if cpu_side and plan.cpu_repack:
        # copied into anonymous memory at load (the CPU side's share of the repacked types): these
        # cannot stream from NVMe, and llama.cpp fails to load when the copy does not fit; the file's
        # pages it read stay behind as reclaimable cache. The rest stays in the mmap, as below.
        rep = cpu_side * repacked_bytes(model, hw.cpu.isa) / model.routed_bytes
        if rep:
            ram[REPACKED] = rep
            cpu_side -= rep
    if p.experts_home == "nvme":
        nvme["experts"] = cpu_side
        ram["experts (page cache)"] = min(cpu_side, float(p.expert_ram_bytes or 0))
    elif p.expert_ram_bytes is not None and p.expert_ram_bytes < cpu_side:
        ram["experts"] = float(p.expert_ram_bytes)
        nvme["experts"] = cpu_side - p.expert_ram_bytes
    else:
        ram["experts"] = cpu_side
    if p.engram == "nvme" and model.engram is not None:
        nvme["engram"] = model.engram_table_bytes
    card: dict[str, float] = {}
    if plan.device_tier.slots:
        card = {"reserved": float(hw.expert_device.reserved_bytes), "expert slots": plan.device_tier.slots * model.expert_bytes}
    return MemoryMap(vram=vram, ram=ram, nvme=nvme, card=card,
                     vram_capacity=float(hw.gpu.vram_bytes) if hw.gpu else 0.0,
                     ram_capacity=float(hw.memory.capacity_bytes), nvme_capacity=float(hw.nvme.capacity_bytes),
                     expert_bytes=model.expert_bytes, kv_bytes_per_token=kv_tok)


def size_device_tier(model: ModelSpec, hw: HardwareSpec, plan: Plan) -> Plan:
    """The plan with a second card's expert slots (hw.expert_device) filling what the card leaves free."""
    dev = hw.expert_device
    if dev is None:
        return plan
    slots = min(int(dev.free_bytes // model.expert_bytes), model.routed_experts)
    return plan.model_copy(update={"device_tier": plan.device_tier.model_copy(update={"slots": max(0, slots)})})


def size_cache(model: ModelSpec, hw: HardwareSpec, plan: Plan) -> Plan:
    """The plan with its expert cache grown to every slot the free VRAM holds (policy kept)."""
    if plan.expert_cache.policy == "none" or hw.gpu is None:
        return plan
    base = plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(update={"slots": 0})})
    slots = min(memory_map(model, hw, base).free_slots, model.routed_experts)
    return plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(update={"slots": slots})})
