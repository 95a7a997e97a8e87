"""Shared fixtures: a small MoE GGUF written with the `gguf` package (real file, real header)."""
import gguf
import numpy as np
import pytest

Q = gguf.GGMLQuantizationType
H, F, E, L, V = 64, 32, 8, 3, 300


def _raw(rng, qtype, shape):
    """Random bytes for a quantised tensor of logical numpy `shape` (outermost first)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    byte_shape = (*shape[:-1], shape[-1] // block * size)
    return rng.integers(0, 256, size=byte_shape, dtype=np.uint8)


def write_moe_gguf(path, engram_rows=1000, arch="qwen3moe", extra_kv=None):
    """A small qwen3moe GGUF: experts in Q4_0 / Q8_0 / Q4_K, F16 attention, IQ4_NL table as raw bytes.
    arch, extra_kv ({key without the arch prefix: value}): the same tensors under another architecture."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (extra_kv or {}).items():
        w.add_key_value(f"{arch}.{k}", v, gguf.GGUFValueType.UINT32 if isinstance(v, int) else gguf.GGUFValueType.BOOL)
    w.add_block_count(L); w.add_embedding_length(H); w.add_context_length(4096)
    w.add_expert_count(E); w.add_expert_used_count(2); w.add_expert_feed_forward_length(F)
    w.add_head_count(4); w.add_head_count_kv(2); w.add_key_length(16); w.add_value_length(16)
    w.add_token_list([f"t{i}".encode() for i in range(V)])
    tensors = {}

    def add(name, arr, qtype=None):
        tensors[name] = arr.nbytes
        w.add_tensor(name, arr, raw_dtype=qtype)

    add("token_embd.weight", rng.standard_normal((V, H)).astype(np.float16))
    add("output.weight", _raw(rng, Q.Q8_0, (V, H)), Q.Q8_0)
    add("per_layer_token_embd.weight", _raw(rng, Q.IQ4_NL, (engram_rows, 256)), Q.IQ4_NL)
    exp_types = [Q.Q4_0, Q.Q8_0, Q.Q4_K]
    for i in range(L):
        add(f"blk.{i}.attn_q.weight", rng.standard_normal((64, H)).astype(np.float16))
        add(f"blk.{i}.ffn_gate_inp.weight", rng.standard_normal((E, H)).astype(np.float32))
        t = exp_types[i]
        hk = H if t != Q.Q4_K else 256  # K-quants need 256-wide rows
        add(f"blk.{i}.ffn_gate_exps.weight", _raw(rng, t, (E, F, hk)), t)
        add(f"blk.{i}.ffn_up_exps.weight", _raw(rng, t, (E, F, hk)), t)
        add(f"blk.{i}.ffn_down_exps.weight", _raw(rng, Q.Q8_0, (E, hk, F)), Q.Q8_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return tensors




@pytest.fixture(scope="session")
def moe_gguf(tmp_path_factory):
    """(path, {tensor name: bytes}) of a 3-layer qwen3moe GGUF with mixed expert types."""
    path = tmp_path_factory.mktemp("gguf") / "moe.gguf"
    return path, write_moe_gguf(path)


@pytest.fixture
def write_gguf():
    """write_moe_gguf, for tests that write the same tensors under another architecture or metadata."""
    return write_moe_gguf


# ---------------------------------------------------------------------------------------------
# A cold executor run: what numba compiles (tests/executor/test_plans.py asserts on it)
# ---------------------------------------------------------------------------------------------

_COLD_RUN = """
import importlib, json
from pathlib import Path
import numba
from numba.core import event
from executor.runner import Runner, default_prompts
from specs.plan import ExpertCache, Plan
tiny = Path({tiny!r})
in_steps = event.RecordingListener()
for plan in (Plan(),  # all-CPU: the fused layer loop
             Plan(streams=4, expert_cache=ExpertCache(slots=40, policy="lru"))):  # 4 tokens a row group
    r = Runner(plan, tiny, 8)
    event.register("numba:compile", in_steps)  # from the first prefill on: what the TTFT and the ITL time
    r.generate(default_prompts(plan.streams, 4, 512, seed=11), 3)
    event.unregister("numba:compile", in_steps)
    r.experts.close()
counts = {{}}
for m in ("kernels", "row_products", "gemm", "qgemm", "qdecode", "kquants", "kquant_blocks", "iquants", "simd", "vnni", "cpu_experts", "dense_kernels",
          "attention_tiles",
          "cpu_layers", "attention", "engram", "cpu_step", "experts"):
    mod = importlib.import_module("executor." + m)
    for k, v in vars(mod).items():
        if isinstance(v, numba.core.registry.CPUDispatcher) and v.__module__ == mod.__name__:
            counts[m + "." + k] = len(v.signatures)
compiled = sorted({{e.data["dispatcher"].py_func.__qualname__ for _, e in in_steps.buffer}})
print(json.dumps({{"signatures": counts, "compiled_in_steps": compiled}}))
"""


def _numba_cache_is_empty() -> bool:
    """Whether the project's numba cache (numba's default: __pycache__ beside the sources) holds no executor kernel:
    a fresh clone, as CI runs. False where NUMBA_CACHE_DIR points elsewhere."""
    import os
    from pathlib import Path
    if os.environ.get("NUMBA_CACHE_DIR"):
        return False
    return not any((Path(__file__).parents[1] / "executor" / "__pycache__").glob("*.nbi"))


@pytest.fixture(scope="session")
def cold_run(tmp_path_factory):
    """An all-CPU run and 4 streams through a cache of `tiny`, in a fresh process with an empty numba cache (a callee
    inside a cached caller is never compiled, so only a cold run shows what compiles): each executor kernel's
    signatures, and the kernels compiled during the timed steps. On a fresh clone the empty cache is the project's
    own, which the run then fills for the rest of the session (one cold compile in CI, not two: ~1 min on two
    Zen 4 vCPUs, ~2 before kernel_table.py); elsewhere a temporary one."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from executor.make_model import make_model
    tiny = make_model("tiny", tmp_path_factory.mktemp("cold-run") / "tiny.gguf", seed=0, engram=True)
    env = dict(os.environ)
    if not _numba_cache_is_empty():
        env["NUMBA_CACHE_DIR"] = str(tmp_path_factory.mktemp("numba-cache"))
    out = subprocess.run([sys.executable, "-c", _COLD_RUN.format(tiny=str(tiny))], env=env,
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session", autouse=True)
def _cold_run_first_on_an_empty_cache(request):
    """Where the cold-run tests are selected and the project's numba cache is empty, the cold run goes first and fills
    the cache that every later test then loads from."""
    if any("cold_run" in getattr(item, "fixturenames", ()) for item in request.session.items) and _numba_cache_is_empty():
        request.getfixturevalue("cold_run")
