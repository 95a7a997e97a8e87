"""A user's llama.cpp runs as measured evidence: llama-bench output (json, jsonl, csv, md) and
llama-server timing lines, each turned into a run with the placement its flags set up."""
from __future__ import annotations

import csv
import io
import json
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from planner.llamacpp import parse
from specs.errors import SpecError
from specs.loaders import read_text
from specs.model import ModelSpec
from specs.plan import Plan

from .page_layout import page_breaks_of


@dataclass(frozen=True)
class BenchRun:
    """One llama-bench test: prompt processing (pp) or generation (tg) of n tokens."""

    test: str  # 'pp64', 'tg32', 'pp512+tg128'
    n_prompt: int
    n_gen: int
    tok_s: float
    tok_s_std: float
    flags: tuple[str, ...]  # the llama.cpp flags that set up the placement
    backend: str
    model_file: str
    build: str
    source: str  # file it came from
    cold_reps: int = 0  # first repetitions left out of tok_s: they read the weights from disk (warm_rate)

    @property
    def metric(self) -> str:
        """'decode_tok_s' for generation tests, 'prefill_tok_s' for prompt processing."""
        return "decode_tok_s" if self.n_gen and not self.n_prompt else "prefill_tok_s"

    def plan(self, model: ModelSpec) -> Plan:
        """The placement these flags give on `model` (no GPU when the backend is CPU only)."""
        return parse(list(self.flags), model, has_gpu=self.backend.upper() not in ("CPU", "BLAS"))

    def to_dict(self) -> dict:
        return asdict(self)


# llama-bench record fields -> the llama.cpp flag that sets them
_FIELD_FLAGS = (("n_gpu_layers", "-ngl"), ("n_cpu_moe", "--n-cpu-moe"), ("n_ubatch", "-ub"),
                ("n_batch", "-b"), ("n_threads", "-t"))
# Markdown column names llama-bench uses for the same fields
_MD_COLUMNS = {"ngl": "n_gpu_layers", "n_cpu_moe": "n_cpu_moe", "n_ubatch": "n_ubatch",
               "n_batch": "n_batch", "threads": "n_threads", "ot": "tensor_buft_overrides",
               "nopo": "no_op_offload", "backend": "backends", "model": "model_type", "test": "test",
               "rpk": "repack"}


def _flags(rec: dict, path: str) -> tuple[str, ...]:
    out: list[str] = []
    for key, flag in _FIELD_FLAGS:
        if key in rec and rec[key] not in (None, ""):
            v = int(float(rec[key]))
            if key == "n_gpu_layers" and v < 0:
                v = 999  # -1: llama-bench's "all layers"
            out += [flag, str(v)]
    ot = str(rec.get("tensor_buft_overrides", "none") or "none")
    if ot != "none":
        for item in ot.split(";"):
            out += ["-ot", item]
    if str(rec.get("no_op_offload", "0")).lower() in ("1", "true"):
        out.append("--no-op-offload")
    if str(rec.get("repack", "true")).lower() in ("0", "false"):
        out.append("--no-repack")
    if str(rec.get("load_mode", "auto")).lower() in ("none", "dio") or str(rec.get("use_mmap", "1")).lower() in ("0", "false"):
        out.append("--no-mmap")  # weights read into buffers (llama-bench -lm none|dio, or -mmp 0 before it)
    return tuple(out)


def _test_name(n_prompt: int, n_gen: int) -> str:
    return "+".join(x for x in (f"pp{n_prompt}" if n_prompt else "", f"tg{n_gen}" if n_gen else "") if x)


# A first repetition under this fraction of the later ones' median read the file from disk: llama-bench's warmup
# touches only the experts its token routes to, and where the page cache has dropped the file (on the Zen 4 VM
# after `calibrate --quick`'s 5.5 GB, 2026-12-06) the first repetition of `small` tg64 on one thread ran at 22-37
# tok/s and the next two at 52-60. The simulator predicts the warm decode the later repetitions measure.
COLD_FIRST_REP = 0.75


def warm_rate(avg_ts: float, std_ts: float, samples: list[float] | None) -> tuple[float, float, int]:
    """(tok/s, its sample standard deviation, repetitions left out): llama-bench's avg_ts and stddev_ts, or those of
    the later repetitions where the first ran under COLD_FIRST_REP x their median (three repetitions or more)."""
    if not samples or len(samples) < 3:
        return avg_ts, std_ts, 0
    rest = [float(x) for x in samples[1:]]
    if float(samples[0]) >= COLD_FIRST_REP * statistics.median(rest):
        return avg_ts, std_ts, 0
    return statistics.mean(rest), statistics.stdev(rest), 1


def _from_record(rec: dict, path: str) -> BenchRun:
    try:
        n_prompt, n_gen = int(float(rec["n_prompt"])), int(float(rec["n_gen"]))
        samples = rec.get("samples_ts")  # json and jsonl carry each repetition's rate; csv and markdown do not
        samples = samples if isinstance(samples, list) else None
        tok_s, std, cold = warm_rate(float(rec["avg_ts"]), float(rec.get("stddev_ts", 0) or 0), samples)
        return BenchRun(test=_test_name(n_prompt, n_gen), n_prompt=n_prompt, n_gen=n_gen, tok_s=tok_s, tok_s_std=std,
                        flags=_flags(rec, path), backend=str(rec.get("backends", "")),
                        model_file=str(rec.get("model_filename", "")), build=str(rec.get("build_commit", "")),
                        source=path, cold_reps=cold)
    except KeyError as e:
        raise SpecError(path, str(e.args[0]), "missing from the llama-bench record") from None
    except ValueError as e:
        raise SpecError(path, None, f"bad number in a llama-bench record: {e}") from None


def _parse_md(text: str, path: str, extra_flags: tuple[str, ...]) -> list[BenchRun]:
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    if len(rows) < 3:
        raise SpecError(path, None, "no llama-bench Markdown table found")
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    runs = []
    for ln in rows[2:]:
        cells = dict(zip(head, (c.strip() for c in ln.strip("|").split("|"))))
        m = re.fullmatch(r"(?:pp(\d+))?\+?(?:tg(\d+))?(?: @ d\d+)?", cells.get("test", ""))
        ts = re.fullmatch(r"([\d.]+)\s*±\s*([\d.]+)", cells.get("t/s", ""))
        if not m or not ts:
            raise SpecError(path, "test" if not m else "t/s", f"cannot read row {ln.strip()!r}")
        rec = {_MD_COLUMNS[k]: v for k, v in cells.items() if k in _MD_COLUMNS}
        rec.update(n_prompt=m[1] or 0, n_gen=m[2] or 0, avg_ts=ts[1], stddev_ts=ts[2])
        run = _from_record(rec, path)
        runs.append(BenchRun(**{**asdict(run), "flags": tuple(extra_flags) + run.flags}))
    return runs


def read_llama_bench(path: str | Path, extra_flags: tuple[str, ...] = ()) -> list[BenchRun]:
    """Every test of a llama-bench output file (-o json, jsonl, csv or md), format detected."""
    path = str(path)
    body = read_text(path).lstrip()
    if not body:
        raise SpecError(path, None, "empty: no llama-bench results in it")
    try:
        if body.startswith("["):
            recs = json.loads(body)
        elif body.startswith("{"):
            recs = [json.loads(ln) for ln in body.splitlines() if ln.strip()]
        elif body.startswith("|"):
            return _parse_md(body, path, extra_flags)
        elif body.startswith("build_commit") or "," in body.splitlines()[0]:
            recs = list(csv.DictReader(io.StringIO(body)))
        else:
            raise SpecError(path, None, "not llama-bench output (json, jsonl, csv or md)")
    except json.JSONDecodeError as e:
        raise SpecError(path, f"line {e.lineno}", f"malformed JSON: {e.msg}") from None
    return [BenchRun(**{**asdict(r), "flags": tuple(extra_flags) + r.flags})
            for r in (_from_record(rec, path) for rec in recs)]


_TIMING = re.compile(r"(prompt eval|eval) time\s*=\s*([\d.]+) ms /\s*(\d+) (?:tokens|runs)")


def read_server_timings(text: str, source: str, flags: tuple[str, ...], model_file: str = "") -> list[BenchRun]:
    """llama-server / llama-cli timing lines ('prompt eval time = X ms / N tokens', 'eval time = ...')."""
    runs = []
    for kind, ms, n in _TIMING.findall(text):
        n_tok, t = int(n), float(ms) / 1e3
        pp = kind == "prompt eval"
        runs.append(BenchRun(test=_test_name(n_tok if pp else 0, 0 if pp else n_tok), n_prompt=n_tok if pp else 0,
                             n_gen=0 if pp else n_tok, tok_s=n_tok / t if t else 0.0, tok_s_std=0.0,
                             flags=tuple(flags), backend="", model_file=model_file, build="", source=source))
    if not runs:
        raise SpecError(source, None, "no llama.cpp timing lines ('eval time = ... ms / N tokens') found")
    return runs


def run_case_name(model: ModelSpec, run: BenchRun) -> str:
    """A stable case name: model and its expert type, test and placement flags ('llamacpp:<model> Q4_0:tg32:-t 2 ...').
    The type is in the name because llama-quantize keeps general.name: two quantisations of one model are two cases."""
    return f"llamacpp:{model.name} {model.expert_format}:{run.test}:{' '.join(run.flags)}"


def ingest_runs(files: list[str], model_ref: str, flags: str, store: str | Path,
                timings: bool = False, page_breaks: str | None = "auto") -> list[dict]:
    """Read runs, check each one's flags into a placement, append them to the results store. page_breaks: the
    model file's page layout when the runs read it (page_breaks_of; 'auto', the default: read from the file now),
    into each plan's cpu_file_page_breaks."""
    import shlex

    from specs.loaders import load_model

    from .store import append_rows, make_row

    model = load_model(model_ref)
    page_breaks_of(page_breaks if page_breaks != "auto" else None, "")  # a bad number fails before any file is read
    extra = tuple(shlex.split(flags))
    runs: list[BenchRun] = []
    for f in files:
        if timings:
            runs += read_server_timings(read_text(f), f, extra, model_file=model_ref)
        else:
            runs += read_llama_bench(f, extra)
    rows = []
    layouts: dict[str, float | None] = {}
    for r in runs:
        plan = r.plan(model)  # raises with the flag named when llama.cpp would reject it
        if r.model_file not in layouts:
            gguf = r.model_file or (model_ref if model_ref.endswith(".gguf") else "")
            layouts[r.model_file] = page_breaks_of(page_breaks, gguf)
        if layouts[r.model_file] is not None and plan.cpu_mmap:
            plan = plan.model_copy(update={"cpu_file_page_breaks": layouts[r.model_file]})
        rows.append(make_row(run_case_name(model, r), r.metric, r.tok_s, std=r.tok_s_std, model=model_ref,
                             engine="llamacpp", flags=" ".join(r.flags), backend=r.backend,
                             n_prompt=r.n_prompt, n_gen=r.n_gen, build=r.build, source=r.source, cold_reps=r.cold_reps,
                             plan=json.dumps(plan.model_dump(mode="json"), separators=(",", ":"))))
    append_rows(store, rows)
    return rows
