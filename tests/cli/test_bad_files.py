"""Bad files wherever a command takes a path: one line naming the file and the reason, exit code 2, no
traceback; nothing half-written or overwritten left behind. Each file is real: random bytes, a UTF-16
file, an empty file, a folder."""
import json
from pathlib import Path

import pytest

from moe_offload.cli import main

HW = "epyc8ch-3090"


def one_line(capsys, argv) -> str:
    """Run the CLI in process -> its one stderr line (asserting exit code 2 and no traceback)."""
    code = main(list(argv))
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


@pytest.fixture
def files(tmp_path):
    """{kind: path} of the bad inputs, and a good all-CPU plan."""
    (tmp_path / "binary.dat").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "utf16.json").write_text('{"placement": {}}', encoding="utf-16")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "folder").mkdir()
    (tmp_path / "plan.json").write_text(json.dumps({"placement": {"dense": "cpu", "kv": "cpu"}}))
    return {k: tmp_path / n for k, n in (("binary", "binary.dat"), ("utf16", "utf16.json"), ("empty", "empty.yaml"),
                                          ("folder", "folder"), ("plan", "plan.json"))}


# each command that reads a file the user names, with {f} where the bad file goes
READERS = [
    ("plan", "--hw", "{f}"),
    ("plan", "--hw", HW, "--model", "{f}"),
    ("fit", "--hw", HW, "--plan", "{f}"),
    ("simulate", "--hw", HW, "--plan", "{f}"),
    ("simulate", "--hw", HW, "--engine", "llamacpp", "--routing", "{f}"),
    ("execute", "--plan", "{f}", "--model", "m.gguf"),
    ("execute", "--plan", "{plan}", "--model", "m.gguf", "--hw", "{f}"),
    ("ingest", "{f}", "--model", "deepseek-v4.1-flash", "--store", "{tmp}/st.csv"),
    ("ingest", "{f}", "--model", "deepseek-v4.1-flash", "--timings", "--store", "{tmp}/st.csv"),
    ("regress", "--local-only", "--hw", HW, "--store", "{f}"),
    ("regress", "--local-only", "--hw", "{f}"),
    ("hw", "--hw", "{f}"),
]


@pytest.mark.parametrize("kind", ["binary", "utf16", "empty", "folder"])
@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a[:3]))
def test_a_bad_file_is_one_line_naming_it(capsys, files, kind, argv):
    """Before: random bytes or a UTF-16 file ended in a UnicodeDecodeError traceback (exit 1) in every one of
    these; an empty routing trace or llama-bench file in a ValueError / IndexError; a bad store or
    profile given to `regress` was never read (exit 0)."""
    f = files[kind]
    line = one_line(capsys, [a.format(f=f, plan=files["plan"], tmp=f.parent) for a in argv])
    assert line.startswith(f"moe-offload: {f}") or line.startswith("moe-offload: --"), line


def test_binary_file_reason_names_the_byte(capsys, files):
    assert one_line(capsys, ["plan", "--hw", str(files["binary"])]).endswith(
        "not a UTF-8 text file (byte 0x80 at offset 128)")


def test_empty_profile_says_empty(capsys, files):
    assert one_line(capsys, ["plan", "--hw", str(files["empty"])]).endswith("empty: expected a mapping of fields")


def test_unknown_routing_model_is_named(capsys):
    line = one_line(capsys, ["simulate", "--hw", HW, "--engine", "llamacpp", "--routing", "zipfian"])
    assert "--routing: no such file or routing model 'zipfian' (uniform, skewed, fitted, drifting" in line


def test_local_only_without_a_profile(capsys):
    """`regress --local-only` without --hw checked nothing and exited 0."""
    assert "--local-only: needs --hw" in one_line(capsys, ["regress", "--local-only"])


def test_an_absent_store_is_said(capsys, tmp_path):
    line = one_line(capsys, ["regress", "--local-only", "--hw", HW, "--store", str(tmp_path / "none.csv")])
    assert line.endswith("none.csv: no such results store")


def test_ingest_never_rewrites_a_file_that_is_not_a_store(capsys, tmp_path):
    """Before: `--store README.md` turned the README into a CSV with the runs' columns appended to its first line."""
    readme = tmp_path / "README.md"
    readme.write_text("# a project\n\nsome text, with a comma\n")
    before = readme.read_bytes()
    fixture = Path(__file__).parents[1] / "fixtures" / "llama-bench" / "tiny-t12.csv"
    line = one_line(capsys, ["ingest", str(fixture), "--model", "deepseek-v4.1-flash", "--store", str(readme)])
    assert "header: not a results store" in line and readme.read_bytes() == before


@pytest.mark.parametrize("argv,where", [
    (("plan", "--hw", HW, "--out", "{folder}"), "is a folder, not a file"),
    (("make-model", "--preset", "tiny", "--out", "{folder}"), "is a folder, not a file"),
    (("report", "--hw", HW, "--out", "{binary}"), "is a file, not a folder"),
    (("execute", "--plan", "{plan}", "--model", "m.gguf", "--trace", "{folder}"), "is a folder, not a file"),
    (("plan", "--hw", HW, "--out", "{binary}/plan.json"), "cannot make its folder: {binary} is a file"),
], ids=lambda a: " ".join(a[:1]) if isinstance(a, tuple) else a)
def test_an_output_path_that_cannot_be_written(capsys, files, argv, where):
    """Checked before the work (make-model wrote 23 MB of `tiny` to `<out>.tmp`, left it, then raised
    IsADirectoryError); nothing is left beside the path."""
    before = sorted(p.name for p in files["plan"].parent.iterdir())
    line = one_line(capsys, [a.format(**files) for a in argv])
    assert line.endswith(where.format(**files)), line
    assert sorted(p.name for p in files["plan"].parent.iterdir()) == before


def test_a_routing_trace_line_that_is_not_json_is_named(capsys, tmp_path):
    t = tmp_path / "routes.jsonl"
    t.write_text('{"experts": [[1, 2]]}\n{"experts": [[3, 4]\n')
    line = one_line(capsys, ["simulate", "--hw", HW, "--engine", "llamacpp", "--routing", str(t)])
    assert line.startswith(f"moe-offload: {t}: line 2: malformed JSON")
