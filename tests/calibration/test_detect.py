"""--hw auto: what is read off the machine is measured (with date and where), the rest assumed with
a reason; describe() lists every figure with its provenance."""
import os
import struct
import types

import pytest

from calibration import calibrate as cal, detect
from specs.figure import SOURCES, Figure
from specs.loaders import dump_hardware, load_hardware

DMIDECODE = """\
# dmidecode 3.3
Handle 0x0040, DMI type 17, 92 bytes
Memory Device
\tSize: 32 GB
\tLocator: DIMM_A1
\tType: DDR5
\tSpeed: 5600 MT/s
\tConfigured Memory Speed: 5200 MT/s

Handle 0x0041, DMI type 17, 92 bytes
Memory Device
\tSize: No Module Installed
\tLocator: DIMM_A2

Handle 0x0042, DMI type 17, 92 bytes
Memory Device
\tSize: 32 GB
\tLocator: DIMM_B1
\tType: DDR5
\tSpeed: 5600 MT/s
\tConfigured Memory Speed: 5200 MT/s
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp i8mm bf16
CPU implementer\t: 0x61
"""


def _figures(hw):
    for part in (hw.gpu, hw.pcie, hw.memory, hw.cpu, hw.nvme):
        if part is None:
            continue
        for name in type(part).model_fields:
            v = getattr(part, name)
            if isinstance(v, Figure):
                yield f"{type(part).__name__}.{name}", v
            elif isinstance(v, dict):
                for k, f in v.items():
                    yield f"{name}.{k}", f


@pytest.fixture(scope="module")
def hw():
    return detect.detect_hardware()


def test_detects_this_machine(hw):
    assert hw.cpu.cores == len(os.sched_getaffinity(0))
    meminfo = detect.mem_info()
    assert float(hw.memory.capacity_bytes) == meminfo["MemTotal"]
    assert hw.memory.capacity_bytes.source == "measured" and "/proc/meminfo" in hw.memory.capacity_bytes.ref
    assert set(hw.cpu.isa) <= set(detect.ISA_FLAGS)
    assert hw.page_bytes == os.sysconf("SC_PAGE_SIZE")
    import torch
    if not torch.cuda.is_available() and detect.shutil.which("nvidia-smi") is None:
        assert hw.gpu is None and hw.pcie is None


def test_every_figure_has_provenance(hw):
    for name, f in _figures(hw):
        assert f.source in SOURCES, name
        assert f.ref, name  # measured: date and where; assumed: the reason
        if f.source == "measured":
            assert f.ref[:4].isdigit(), name


def test_describe_rows(hw):
    rows = detect.describe(hw)
    assert all(len(r) == 4 and all(isinstance(x, str) for x in r) for r in rows)
    fields = {r[0]: r for r in rows}
    for f in ("cpu.cores", "cpu.model", "cpu.isa", "memory.capacity_bytes", "memory.channels", "memory.mts",
              "nvme.rand_4k_iops", "gpu", "page_bytes"):
        assert f in fields, f
    for r in rows[1:]:  # every row but the name says where it came from
        assert r[2] in SOURCES, r
    assert fields["cpu.cores"][1] == str(len(os.sched_getaffinity(0)))
    if not detect.dimm_info()[0]:
        assert fields["memory.channels"][2] == "assumed" and "not readable" in fields["memory.channels"][3]


def test_yaml_round_trip_keeps_provenance(hw, tmp_path):
    p = tmp_path / "auto.yaml"
    p.write_text(dump_hardware(hw))
    back = load_hardware(str(p))
    assert detect.describe(back) == detect.describe(hw)


def test_parse_dmidecode():
    devs = detect.parse_dmidecode(DMIDECODE)
    assert len(devs) == 2 and all(d["mts"] == 5200 for d in devs)


def test_parse_smbios_type17():
    def s17(size, speed, conf):
        body = bytearray(0x22)
        body[0], body[1] = 17, 0x22
        struct.pack_into("<H", body, 0x0C, size)
        struct.pack_into("<H", body, 0x15, speed)
        struct.pack_into("<H", body, 0x20, conf)
        return bytes(body) + b"DIMM\x00\x00"
    raw = s17(16384, 3200, 2933) + s17(0, 0, 0) + s17(16384, 3200, 0) + bytes([127, 4, 0, 0]) + b"\x00\x00"
    devs = detect.parse_smbios(raw)
    assert [d["mts"] for d in devs] == [2933, 3200]


def test_arm_cpuinfo():
    c = detect.cpu_info(ARM_CPUINFO)
    assert {"asimd", "asimddp", "i8mm", "bf16"} <= set(c["isa"]) and c["usable"] >= 1


def test_dimms_read_become_measured(monkeypatch):
    monkeypatch.setattr(detect, "dimm_info", lambda: (detect.parse_dmidecode(DMIDECODE), "dmidecode -t 17"))
    hw = detect.detect_hardware()
    assert hw.memory.channels == 2 and hw.memory.mts == 5200 and hw.memory.mts.source == "measured"
    notes = detect.provenance_notes(hw)
    assert notes["memory.channels"][0] == "measured"


def test_gpu_from_nvidia_smi(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(detect.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    real_run = detect.subprocess.run

    def fake_run(argv, **kw):
        if argv[0].endswith("nvidia-smi"):
            return types.SimpleNamespace(returncode=0, stdout="NVIDIA GeForce RTX 3090, 24576, 4, 16, 1, 16\n",
                                         stderr="")
        return real_run(argv, **kw)
    monkeypatch.setattr(detect.subprocess, "run", fake_run)
    hw = detect.detect_hardware()
    assert hw.gpu.name == "NVIDIA GeForce RTX 3090"
    assert hw.gpu.vram_bytes == 24576 * 2**20 and hw.gpu.vram_bytes.source == "measured"
    assert hw.gpu.bw_gbs == 936 and hw.gpu.bw_gbs.source == "datasheet"
    assert hw.pcie.gen == 4 and hw.pcie.lanes == 16 and hw.pcie.h2d_gbs.source == "assumed"
    rows = {r[0]: r for r in detect.describe(hw)}
    assert rows["pcie.gen"][2] == "measured" and rows["gpu.name"][2] == "measured"


def test_disk_assumptions_by_kind():
    assert detect._disk_assumptions({"name": "nvme0n1", "driver": "nvme"})[1] >= 100000
    assert detect._disk_assumptions({"name": "sda", "driver": "sd", "rotational": True})[1] < 1000
    assert "virtual" in detect._disk_assumptions({"name": "vda", "driver": "virtio_blk"})[3]


def test_measure_fills_from_quick_calibration(monkeypatch, tmp_path):
    monkeypatch.setattr(cal, "QUICK", cal.TINY)
    hw = detect.detect_hardware(measure=True, path=tmp_path)
    for f in (hw.memory.efficiency, hw.nvme.rand_4k_iops, hw.nvme.latency_us, hw.nvme.seq_read_gbs,
              hw.cpu.expert_gbs["default"], hw.constants["t_hit_ms"], hw.constants["sync_ms"]):
        assert f.source == "measured" and f > 0
    assert hw.memory.capacity_bytes.source == "measured"
    assert os.listdir(tmp_path) == []


def test_assumed_cpu_expert_rates_follow_isa_and_bits():
    """Unmeasured CPU expert rates are weights/s per core by ISA class times the format's bits:
    six VNNI cores on 3.5-bit codebooks land in Strata's reported 23-26 GB/s; Q8_0 moves 8.5/4.5 the
    bytes of the 4.5-bit default; AVX2 without VNNI is slower than VNNI."""
    from calibration.detect import assumed_expert_gbs, isa_class
    assert isa_class(["avx2", "avx_vnni"]) == "vnni" and isa_class(["avx2", "fma"]) == "avx2"
    assert isa_class(["sse4_2"]) == "other"
    vnni = assumed_expert_gbs(6, ["avx2", "avx_vnni"])
    assert 23.0 <= float(vnni["codebook"]) <= 26.0
    assert float(vnni["Q8_0"]) / float(vnni["default"]) == pytest.approx(8.5 / 4.5)
    assert float(assumed_expert_gbs(6, ["avx2"])["default"]) < float(vnni["default"])
    assert all(f.source == "assumed" and "G weights/s" in f.ref for f in vnni.values())


def test_last_level_cache_is_the_highest_level_sysfs_lists(tmp_path):
    from calibration.detect import llc_bytes
    for i, (level, size) in enumerate([(1, "32K"), (1, "32K"), (2, "512K"), (3, "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    assert llc_bytes(str(tmp_path)) == 32 << 20
    assert llc_bytes(str(tmp_path / "none")) is None


def test_a_cores_l2_is_its_level_2_data_or_unified_cache(tmp_path):
    """executor.cpu_caches.cache_bytes(2): the level-2 cache sysfs lists that is not an instruction cache (the
    executor's token groups are sized by it); None where there is no level 2."""
    from executor.cpu_caches import cache_bytes
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Instruction", "4M"),
                                             (2, "Unified", "1024K"), (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, v in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{v}\n")
    assert cache_bytes(2, str(tmp_path)) == 1 << 20
    assert cache_bytes(1, str(tmp_path)) == 48 << 10
    assert cache_bytes(None, str(tmp_path)) == 32 << 20
    assert cache_bytes(4, str(tmp_path)) is None
