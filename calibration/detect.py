"""`--hw auto`: detect this machine, every figure with its provenance.

What is read off the machine (/proc/cpuinfo, os.sched_getaffinity, /proc/meminfo, SMBIOS memory
devices through dmidecode or /sys/firmware/dmi, torch.cuda / nvidia-smi, /sys/block) is marked
`measured` with the date and where it was read; everything else is `assumed`, and its ref says
why (nothing readable) and what was assumed. Fields that are not figures (channel count, PCIe
generation and lanes, core count) carry their provenance in `notes`, one line each
(`@ field: source: ref`), which `describe` prints.

With `measure=True` the bandwidths, the disk and the CPU expert throughput come from a quick
calibration (calibration.calibrate), marked measured.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
from pathlib import Path

from executor.cpu_caches import SYSFS_CACHES, cache_bytes
from specs.figure import Figure
from specs.hardware import CPU, GPU, HardwareSpec, Memory, NVMe, PCIe

from .sampling import today

_PROV = "@ "
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2")
# PCIe payload per lane, GB/s, by generation (after line coding)
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563, 7: 15.125}
# name fragment -> (VRAM GB/s, dense fp16 tensor TFLOPS), from the vendors' spec sheets
GPU_TABLE = {
    "H200": (4800, 989), "H100 SXM": (3350, 989), "H100 PCIe": (2000, 756), "H100": (3350, 989),
    "A100-SXM4-80GB": (2039, 312), "A100 80GB PCIe": (1935, 312), "A100": (1555, 312),
    "L40S": (864, 362), "L4": (300, 121), "A10G": (600, 70), "T4": (320, 65),
    "RTX 5090": (1792, 209.5), "RTX 5080": (960, 112.6), "RTX 5070 Ti": (896, 87.9), "RTX 5070": (672, 61.7),
    "RTX 4090": (1008, 165.2), "RTX 4080": (717, 97.5), "RTX 4070": (504, 58.3),
    "RTX 3090 Ti": (1008, 80), "RTX 3090": (936, 71), "RTX 3080": (760, 59.5), "RTX 3060": (360, 25.5),
}


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _measured(value: float, where: str) -> Figure:
    return Figure(float(value), "measured", f"{today()}, read from {where}")


def _assumed(value: float, why: str) -> Figure:
    return Figure(float(value), "assumed", why)


# ---------------------------------------------------------------------------------------------
# probes (each returns plain data; None when nothing is readable)
# ---------------------------------------------------------------------------------------------

def llc_bytes(root: str = SYSFS_CACHES) -> int | None:
    """Size of cpu0's last-level cache in bytes (the highest-level cache sysfs lists), or None."""
    return cache_bytes(None, root)


def cpu_info(cpuinfo: str | None = None) -> dict:
    """Model, logical CPUs usable by this process, physical cores, sockets and ISA flags."""
    text = cpuinfo if cpuinfo is not None else (_read("/proc/cpuinfo") or "")
    model, flags, cores_per_socket, sockets = None, set(), None, set()
    for line in text.splitlines():
        k, _, v = line.partition(":")
        k, v = k.strip(), v.strip()
        if k in ("model name", "Model", "Hardware", "cpu model") and not model:
            model = v
        elif k in ("flags", "Features") and not flags:
            flags = set(v.split())
        elif k == "cpu cores" and cores_per_socket is None:
            cores_per_socket = int(v) if v.isdigit() else None
        elif k == "physical id":
            sockets.add(v)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    physical = cores_per_socket * max(1, len(sockets)) if cores_per_socket else None
    return {"model": model or "unknown CPU", "usable": usable, "physical": physical,
            "isa": [f for f in ISA_FLAGS if f in flags], "logical": os.cpu_count() or usable}


def mem_info(meminfo: str | None = None) -> dict:
    """MemTotal and MemAvailable in bytes from /proc/meminfo."""
    text = meminfo if meminfo is not None else (_read("/proc/meminfo") or "")
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m and m[1] in ("MemTotal", "MemAvailable"):
            out[m[1]] = int(m[2]) * 1024
    return out


def parse_dmidecode(text: str) -> list[dict]:
    """Populated memory devices from `dmidecode -t 17` output: size, speed, locator."""
    devs, cur = [], None
    for line in text.splitlines():
        if line.startswith("Memory Device"):
            cur = {}
            devs.append(cur)
        elif cur is not None and ":" in line:
            k, _, v = line.strip().partition(":")
            cur[k.strip()] = v.strip()
    out = []
    for d in devs:
        size = d.get("Size", "")
        if not size or "No Module" in size or size.startswith("0"):
            continue
        speed = None
        for key in ("Configured Memory Speed", "Configured Clock Speed", "Speed"):
            m = re.match(r"(\d+)\s*(MT/s|MHz)", d.get(key, ""))
            if m:
                speed = int(m[1])
                break
        out.append({"size": size, "mts": speed, "locator": d.get("Locator", ""), "type": d.get("Type", "")})
    return out


def parse_smbios(raw: bytes) -> list[dict]:
    """Populated memory devices (SMBIOS type 17) from the raw DMI table (/sys/firmware/dmi/tables/DMI)."""
    out, i = [], 0
    while i + 4 <= len(raw):
        typ, length = raw[i], raw[i + 1]
        if length < 4:
            break
        if typ == 17 and length >= 0x17:
            size = struct.unpack_from("<H", raw, i + 0x0C)[0]
            speed = struct.unpack_from("<H", raw, i + 0x15)[0]
            conf = struct.unpack_from("<H", raw, i + 0x20)[0] if length >= 0x22 else 0
            if size not in (0, 0xFFFF):
                out.append({"size": size, "mts": conf or speed or None, "locator": "", "type": ""})
        if typ == 127:
            break
        j = i + length  # skip the string set (ends with a double NUL)
        while j + 1 < len(raw) and not (raw[j] == 0 and raw[j + 1] == 0):
            j += 1
        i = j + 2
    return out


# Weights one core decodes and multiplies per second (G weights/s), by instruction set and format
# class; bytes per second follow from the format's bits (the DDR cap is the simulator's).
# AVX2 (no VNNI): plain block formats 11.9 = this project's Q8_0 kernel at 23.7-26.7 GB/s on two Zen 3
#   cores (benchmarks/bench_executor.py, 2026-11-29); codebook formats 7.5 = dsv41-flash-offload's
#   66 GB/s of EXL3 at 3.02 bpw on 22 Zen 3 cores (c_b = 0.20 ms per 13.27 MB expert).
# VNNI (int8 dot products in one instruction): plain block 22 = Strata's ~42 GB/s for a plain 2-bit
#   format at ~2.5 bpw on six i5-13600K cores; codebook 9.3 = its i-quants at 23-26 GB/s, 3.5 bpw.
# Without AVX2, half the AVX2 rates (assumed).
GWEIGHTS_PER_CORE = {"vnni": {"block": 22.0, "codebook": 9.3}, "avx2": {"block": 11.9, "codebook": 7.5},
                     "other": {"block": 6.0, "codebook": 3.7}}
_BLOCK_FORMATS = ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "F16", "BF16")


def isa_class(isa: list[str]) -> str:
    """'vnni', 'avx2' or 'other': which row of GWEIGHTS_PER_CORE a CPU with these flags takes."""
    if "avx_vnni" in isa or "avx512_vnni" in isa:
        return "vnni"
    return "avx2" if "avx2" in isa else "other"


def assumed_expert_gbs(cores: int, isa: list[str]) -> dict[str, Figure]:
    """cpu.expert_gbs for `cores` cores of instruction set `isa` from GWEIGHTS_PER_CORE: per common
    format, per class and a default (block formats at 4.5 bits), each `assumed` with its derivation."""
    from specs.formats import parse_format
    cls = isa_class(isa)
    rates = GWEIGHTS_PER_CORE[cls]

    def fig(gw: float, bits: float, what: str) -> Figure:
        return _assumed(cores * gw * bits / 8.0, f"{gw:g} G weights/s per {cls} core ({what}) x {cores} cores "
                                                 f"x {bits:.3g} bits / 8; see detect.GWEIGHTS_PER_CORE")
    out = {name: fig(rates["block"], parse_format(name).bits, "plain block formats") for name in _BLOCK_FORMATS}
    out["codebook"] = fig(rates["codebook"], 3.5, "codebook formats, at 3.5 bits")
    out["block"] = out["default"] = fig(rates["block"], 4.5, "plain block formats, at 4.5 bits")
    return out


def dimm_info() -> tuple[list[dict] | None, str]:
    """Populated DIMMs and where they were read, or (None, why nothing was readable)."""
    tried = []
    exe = shutil.which("dmidecode")
    if exe:
        try:
            r = subprocess.run([exe, "-t", "17"], capture_output=True, text=True, timeout=10)
            if r.returncode == 0:
                devs = parse_dmidecode(r.stdout)
                if devs:
                    return devs, "dmidecode -t 17"
            tried.append(f"dmidecode failed ({(r.stderr or '').strip()[:60] or 'no devices'})")
        except (OSError, subprocess.SubprocessError) as e:
            tried.append(f"dmidecode failed ({e})")
    else:
        tried.append("no dmidecode")
    try:
        raw = Path("/sys/firmware/dmi/tables/DMI").read_bytes()
        devs = parse_smbios(raw)
        if devs:
            return devs, "/sys/firmware/dmi/tables/DMI (SMBIOS type 17)"
        tried.append("SMBIOS table has no memory devices")
    except OSError:
        tried.append("/sys/firmware/dmi/tables/DMI not readable")
    return None, "; ".join(tried)


def gpu_info() -> dict | None:
    """First CUDA GPU: name, VRAM bytes, PCIe gen and lanes (torch.cuda, then nvidia-smi)."""
    info = None
    try:
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info = {"name": p.name, "vram": int(p.total_memory), "where": "torch.cuda.get_device_properties"}
    except Exception:
        info = None
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            r = subprocess.run([exe, "--query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max,"
                                     "pcie.link.gen.current,pcie.link.width.current",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15)
            if r.returncode == 0 and r.stdout.strip():
                f = [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]
                if info is None:
                    info = {"name": f[0], "vram": int(float(f[1]) * 2**20), "where": "nvidia-smi"}
                gen = int(f[2]) if f[2].isdigit() else None
                lanes = int(f[3]) if f[3].isdigit() else None
                if gen and lanes:
                    info.update(gen=gen, lanes=lanes, pcie_where=f"nvidia-smi (max link; current gen {f[4]} x{f[5]})")
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    if info is not None and "gen" not in info:
        link = _sys_pcie_link()
        if link:
            info.update(gen=link[0], lanes=link[1], pcie_where=link[2])
    return info


def _sys_pcie_link() -> tuple[int, int, str] | None:
    """PCIe link of the first NVIDIA display controller from /sys/bus/pci (max speed and width)."""
    root = Path("/sys/bus/pci/devices")
    if not root.is_dir():
        return None
    speeds = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6, "128.0": 7}
    for d in sorted(root.iterdir()):
        if (_read(d / "vendor") or "").strip() != "0x10de" or not (_read(d / "class") or "").startswith("0x03"):
            continue
        sp = (_read(d / "max_link_speed") or "").split(" ")[0]
        w = (_read(d / "max_link_width") or "").strip()
        if sp in speeds and w.isdigit():
            return speeds[sp], int(w), f"/sys/bus/pci/devices/{d.name}/max_link_*"
    return None


def disk_info(path: str | os.PathLike = ".") -> dict | None:
    """The block device holding `path`: name, capacity, rotational, driver/model."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    p = Path("/sys/dev/block") / dev
    if not p.exists():
        return None
    p = p.resolve()
    if (p / "partition").exists():
        p = p.parent
    name = p.name
    size = _read(p / "size")
    uevent = _read(p / "device" / "uevent") or ""
    driver = re.search(r"DRIVER=(\S+)", uevent)
    model = (_read(p / "device" / "model") or "").strip()
    return {"name": name, "bytes": int(size) * 512 if size and size.strip().isdigit() else None,
            "rotational": (_read(p / "queue" / "rotational") or "").strip() == "1",
            "driver": driver[1] if driver else "", "model": model,
            "where": f"/sys/block/{name}"}


# ---------------------------------------------------------------------------------------------
# the profile
# ---------------------------------------------------------------------------------------------

def _disk_assumptions(d: dict | None) -> tuple[float, float, float, str]:
    """(seq GB/s, 4k IOPS, latency us, why) by the kind of device."""
    name = (d or {}).get("name", "")
    driver = (d or {}).get("driver", "")
    if name.startswith("nvme") or driver == "nvme":
        return 3.5, 500000, 80, "NVMe device: typical PCIe 3/4 consumer NVMe (QD32 IOPS, QD1 latency)"
    if driver.startswith("virtio") or name.startswith("vd") or name.startswith("xvd"):
        return 1.0, 50000, 100, f"virtual disk ({driver or name}): assumed like a SATA-class SSD behind a hypervisor"
    if d and d.get("rotational"):
        return 0.2, 200, 8000, f"rotational disk {name}: typical 7200 rpm HDD"
    return 0.5, 80000, 100, f"disk {name or 'unknown'}: typical SATA SSD"


def detect_hardware(measure: bool = False, path: str | os.PathLike = ".", progress: bool | None = None) -> HardwareSpec:
    """This machine as a HardwareSpec; figures read off it are measured, the rest assumed with why.

    `path`: where model files live (its block device is the `nvme` entry). With `measure=True`,
    bandwidths, disk figures and the CPU expert rate come from a quick calibration (progress bars on
    stderr when it is a terminal, or as `progress` says)."""
    date = today()
    prov: list[str] = []

    def note(field: str, source: str, ref: str) -> None:
        prov.append(f"{_PROV}{field}: {source}: {ref}")

    c = cpu_info()
    note("cpu.model", "measured", f"{date}, /proc/cpuinfo model name")
    note("cpu.cores", "measured", f"{date}, os.sched_getaffinity: {c['usable']} usable of {c['logical']} logical"
         + (f", {c['physical']} physical" if c["physical"] else ""))
    note("cpu.threads_used", "assumed", "all usable cores given to the CPU expert tier")
    note("cpu.isa", "measured", f"{date}, /proc/cpuinfo flags")

    m = mem_info()
    total = m.get("MemTotal")
    if total:
        capacity = _measured(total, "/proc/meminfo MemTotal")
        avail = m.get("MemAvailable", total)
        reserve = Figure(float(max(total - avail, 0.05 * total)), "derived",
                         f"{date}: max(MemTotal - MemAvailable = {(total - avail) / 1e9:.2f} GB, 5% of MemTotal)")
    else:
        capacity = _assumed(16e9, "/proc/meminfo not readable: 16 GB assumed")
        reserve = _assumed(2e9, "OS and services: 2 GB assumed")

    dimms, where = dimm_info()
    speeds = [d["mts"] for d in dimms or [] if d.get("mts")]
    if dimms and speeds:
        channels = len(dimms)
        mts = _measured(min(speeds), f"{where}, slowest populated DIMM")
        note("memory.channels", "measured", f"{date}, {where}: {channels} populated DIMMs, one per channel assumed")
    else:
        channels = 2
        mts = _assumed(3200, f"DIMM speed not readable ({where}): DDR4-3200 assumed")
        note("memory.channels", "assumed", f"DIMM layout not readable ({where}): 2 channels assumed")
    memory = Memory(channels=channels, mts=mts, capacity_bytes=capacity,
                    efficiency=_assumed(0.7, "typical streaming-read fraction of DDR peak"),
                    os_reserve_bytes=reserve)

    l2 = cache_bytes(2)
    if l2:
        note("cpu.l2_bytes", "measured", f"{date}, read from {SYSFS_CACHES}/index*/size (level 2)")
    cpu = CPU(model=c["model"], cores=c["usable"], threads_used=c["usable"], isa=c["isa"], l2_bytes=l2,
              expert_gbs=assumed_expert_gbs(c["usable"], c["isa"]))

    g = gpu_info()
    gpu = pcie = None
    if g:
        note("gpu.name", "measured", f"{date}, {g['where']}")
        note("gpu.shares_host", "measured", f"{date}, a CUDA device with its own memory ({g['where']})")
        key = next((k for k in GPU_TABLE if k.lower() in g["name"].lower()), None)
        if key:
            bw = Figure(GPU_TABLE[key][0], "datasheet", f"vendor spec of {key} (built-in table)")
            tf = Figure(GPU_TABLE[key][1], "datasheet", f"vendor spec of {key}, dense FP16 tensor (built-in table)")
        else:
            bw = _assumed(500, f"{g['name']} not in the built-in table: 500 GB/s assumed")
            tf = _assumed(50, f"{g['name']} not in the built-in table: 50 TFLOPS assumed")
        gpu = GPU(name=g["name"], vram_bytes=_measured(g["vram"], g["where"]), bw_gbs=bw, fp16_tflops=tf,
                  reserved_bytes=_assumed(max(1e9, 0.05 * g["vram"]),
                                          "CUDA context, activations, staging: max(1 GB, 5% of VRAM)"))
        if "gen" in g:
            gen, lanes = g["gen"], g["lanes"]
            note("pcie.gen", "measured", f"{date}, {g['pcie_where']}")
            note("pcie.lanes", "measured", f"{date}, {g['pcie_where']}")
        else:
            gen, lanes = 4, 16
            note("pcie.gen", "assumed", "PCIe link not readable (no nvidia-smi or sysfs link info): gen 4 assumed")
            note("pcie.lanes", "assumed", "PCIe link not readable: x16 assumed")
        raw = PCIE_LANE_GBS.get(gen, 1.969) * lanes
        pcie = PCIe(gen=gen, lanes=lanes,
                    h2d_gbs=_assumed(0.8 * raw, f"80% of PCIe gen{gen} x{lanes} raw {raw:.1f} GB/s"),
                    zero_copy_gbs=_assumed(0.72 * raw, f"72% of PCIe gen{gen} x{lanes} raw {raw:.1f} GB/s"))
    else:
        note("gpu", "measured", f"{date}, no CUDA device (torch.cuda.is_available() false, no nvidia-smi)")

    d = disk_info(path)
    seq, iops, lat, why = _disk_assumptions(d)
    if d and d.get("bytes"):
        cap = _measured(d["bytes"], f"{d['where']}/size")
        note("nvme.device", "measured", f"{date}, {d['where']} (driver {d['driver'] or '?'}"
             f"{', rotational' if d['rotational'] else ''}) holds {Path(path).resolve()}")
    else:
        cap = _assumed(500e9, "block device not identifiable: 500 GB assumed")
    nvme = NVMe(seq_read_gbs=_assumed(seq, why), rand_4k_iops=_assumed(iops, why), latency_us=_assumed(lat, why),
                capacity_bytes=cap)
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    note("page_bytes", "measured", f"{date}, os.sysconf(SC_PAGE_SIZE)")

    host = socket.gethostname() or "localhost"
    hw = HardwareSpec(name=f"auto-{host}", gpu=gpu, pcie=pcie, memory=memory, cpu=cpu, nvme=nvme,
                      page_bytes=int(page),
                      notes="\n".join([f"detected by moe-offload hw --hw auto on {date}", *prov]))
    if measure:
        from .calibrate import QUICK, measure_profile
        import sys
        show = sys.stderr.isatty() if progress is None else progress  # bars go to stderr
        hw, _ = measure_profile(QUICK, hw, progress=show, disk_dir=path)
    return hw


# ---------------------------------------------------------------------------------------------
# what was detected vs assumed
# ---------------------------------------------------------------------------------------------

def _fmt(path: str, v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v)) or "-"
    if not isinstance(v, (int, float)):
        return str(v)
    f = float(v)
    # the name that carries the unit: a constant's base name ('c_b_ms.Q4_0' -> 'c_b_ms'), else the leaf
    name = path.split("constants.", 1)[1].split(".")[0] if "constants." in path else path.rsplit(".", 1)[-1]
    if any(f".{t}_gbs." in path for t in ("expert", "rowwise", "repacked", "whole")) or name.endswith("_gbs"):
        return f"{f:.3g} GB/s"
    if name.endswith("_bytes"):
        return f"{f / 1e9:.2f} GB" if f >= 1e8 else f"{int(f)} B"
    if name.endswith("_us"):
        return f"{f:.3g} us"
    if name.endswith("_ms"):
        return f"{f:.4g} ms"
    if name.endswith("_iops"):
        return f"{f:,.0f} IOPS"
    if name == "mts":
        return f"{f:g} MT/s"
    if name.endswith("tflops"):
        return f"{f:g} TFLOPS"
    return f"{f:g}"


def provenance_notes(hw: HardwareSpec) -> dict[str, tuple[str, str]]:
    """field -> (source, ref) for non-figure fields, from the profile's notes (`@ field: source: ref`)."""
    out = {}
    for line in hw.notes.splitlines():
        if line.startswith(_PROV):
            field, _, rest = line[len(_PROV):].partition(": ")
            source, _, ref = rest.partition(": ")
            out.setdefault(field, (source, ref))  # the first line wins: calibrate puts its own first
    return out


def describe(hw: HardwareSpec) -> list[tuple[str, str, str, str]]:
    """Rows (field, value, source, ref) for every figure and detected field of `hw`."""
    notes = provenance_notes(hw)
    rows: list[tuple[str, str, str, str]] = [("name", hw.name, "-", "")]

    def walk(prefix: str, obj) -> None:
        if obj is None:
            src, ref = notes.get(prefix, ("-", ""))
            rows.append((prefix, "none", src, ref))
            return
        for name in type(obj).model_fields:
            val = getattr(obj, name)
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(val, Figure):
                rows.append((path, _fmt(path, val), val.source, val.ref))
            elif isinstance(val, dict):
                for k, v in val.items():
                    p = f"{path}.{k}"
                    if isinstance(v, Figure):
                        rows.append((p, _fmt(p, v), v.source, v.ref))
            elif hasattr(type(val), "model_fields"):
                walk(path, val)
            elif val is None and name in ("gpu", "pcie"):
                src, ref = notes.get(path, notes.get("gpu", ("-", "")))
                rows.append((path, "none", src, ref))
            elif val is None and name == "expert_device":  # a second card is never detected: added by name only
                continue
            elif val is None and name in ("ggml_prefill_ref_tokens", "executor_gemm_activations"):
                continue  # only where calibrate timed the tiled GEMM twice, or the executor's prefill GEMM
            elif name not in ("name", "notes", "constants") or prefix:
                src, ref = notes.get(path, ("-", ""))
                rows.append((path, _fmt(path, val), src, ref))

    walk("", hw)
    if "nvme.device" in notes:
        src, ref = notes["nvme.device"]
        rows.append(("nvme.device", ref.split(" (")[0].split(", ")[-1], src, ref))
    return rows
