"""Loaders: built-in presets and profiles, YAML/JSON files, HF config.json, GGUF headers.

Every failure becomes a SpecError naming the file, the field and the reason.
"""
from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .errors import SpecError, from_validation
from .hardware import ExpertDevice, HardwareSpec
from .model import ModelSpec
from .plan import Plan

_DATA = resources.files("specs") / "data"


def builtin_models() -> list[str]:
    """Names of the built-in model presets."""
    return sorted(p.name[:-5] for p in (_DATA / "models").iterdir() if p.name.endswith(".yaml"))


def builtin_hardware() -> list[str]:
    """Names of the built-in hardware profiles."""
    return sorted(p.name[:-5] for p in (_DATA / "hardware").iterdir() if p.name.endswith(".yaml"))


def read_text(path: str | os.PathLike) -> str:
    """A text file's contents (UTF-8), gzip-decompressed when its name ends in .gz; a file that cannot
    be read or is not UTF-8 text (a binary, a UTF-16 file) is a SpecError naming it."""
    p = Path(path)
    try:
        data = p.read_bytes()
        if p.suffix == ".gz":
            import gzip
            data = gzip.decompress(data)
        return data.decode()
    except FileNotFoundError:
        raise SpecError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise SpecError(str(path), None, "is a folder, not a file") from None
    except UnicodeDecodeError as e:
        raise SpecError(str(path), None, f"not a UTF-8 text file (byte 0x{e.object[e.start]:02x} at offset "
                                         f"{e.start})") from None
    except (OSError, EOFError) as e:  # unreadable, or a corrupt .gz (gzip.BadGzipFile is an OSError)
        raise SpecError(str(path), None, f"cannot read: {getattr(e, 'strerror', None) or e}") from None


# libyaml's safe loader where PyYAML was built with it (the same documents as yaml.SafeLoader's, ~10x faster: regress
# reads a stored model header a run)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_structured(path: str | os.PathLike, text: str | None = None) -> Any:
    """Parse a YAML or JSON file; malformed input is a SpecError naming the line."""
    path = str(path)
    if text is None:
        text = read_text(path)
    try:
        if path.endswith(".json"):
            return json.loads(text)
        return yaml.load(text, Loader=_YAML_LOADER)
    except json.JSONDecodeError as e:
        raise SpecError(path, f"line {e.lineno}", f"malformed JSON: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        raise SpecError(path, where, f"malformed YAML: {getattr(e, 'problem', None) or e}") from None


def _validate(cls: type[BaseModel], data: Any, path: str) -> Any:
    if data is None:
        raise SpecError(path, None, "empty: expected a mapping of fields")
    if not isinstance(data, dict):
        raise SpecError(path, None, f"expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise from_validation(path, e) from None


def builtin_devices() -> list[str]:
    """Names of the built-in expert-device profiles (a second card: `--hw BASE+DEVICE`)."""
    return sorted(p.name[:-5] for p in (_DATA / "devices").iterdir() if p.name.endswith(".yaml"))


def load_expert_device(name_or_path: str) -> ExpertDevice:
    """An expert-device profile (a further card holding experts) from a YAML path or a built-in name."""
    p = Path(name_or_path)
    if p.is_file():
        return _validate(ExpertDevice, read_structured(p), str(p))
    name = p.name[:-5] if p.name.endswith(".yaml") else p.name
    if name in builtin_devices():
        f = _DATA / "devices" / f"{name}.yaml"
        return _validate(ExpertDevice, read_structured(f"{name}.yaml", f.read_text()), f"{name}.yaml")
    raise SpecError(str(name_or_path), None,
                    f"no such file or built-in expert device (built-in: {', '.join(builtin_devices())})")


def load_hardware(name_or_path: str) -> HardwareSpec:
    """A hardware profile from a YAML path or a built-in name ('epyc8ch-3090[.yaml]'); 'BASE+DEVICE' adds an
    expert device (a second card, `specs/data/devices`) to BASE ('epyc8ch-3090+arc-pro-b70')."""
    if "+" in str(name_or_path) and not Path(name_or_path).is_file():
        base, dev = str(name_or_path).split("+", 1)
        hw = load_hardware(base)
        return hw.model_copy(update={"expert_device": load_expert_device(dev), "name": f"{hw.name}+{Path(dev).stem}"})
    p = Path(name_or_path)
    if p.is_file():
        return _validate(HardwareSpec, read_structured(p), str(p))
    if p.is_dir():
        raise SpecError(str(p), None, "is a folder, not a hardware profile")
    name = p.name[:-5] if p.name.endswith(".yaml") else p.name[:-4] if p.name.endswith(".yml") else p.name
    if name in builtin_hardware():
        f = _DATA / "hardware" / f"{name}.yaml"
        return _validate(HardwareSpec, read_structured(f"{name}.yaml", f.read_text()), f"{name}.yaml")
    raise SpecError(str(name_or_path), None,
                    f"no such file or built-in hardware profile (built-in: {', '.join(builtin_hardware())})")


def load_model(name_or_path: str, expert_format: str | None = None) -> ModelSpec:
    """A ModelSpec from a preset name, a ModelSpec YAML, an HF config.json (or the model folder holding it) or a
    GGUF header."""
    p = Path(name_or_path)
    if p.is_dir() and (p / "config.json").is_file():  # a Hugging Face model folder: its config.json
        p = p / "config.json"
    if p.is_file():
        if p.suffix == ".gguf" or _is_gguf(p):
            from .gguf_header import model_from_gguf  # gguf's reader only when needed
            return model_from_gguf(p)
        data = read_structured(p)
        if p.suffix == ".json":
            from .hf_config import model_from_config
            return model_from_config(data, str(p), expert_format=expert_format)
        return _validate(ModelSpec, data, str(p))
    if p.is_dir():
        raise SpecError(str(p), None, "a folder without a config.json (a model is a preset, a config.json or its "
                                      "folder, a .gguf or a ModelSpec YAML)")
    if name_or_path in builtin_models():
        f = _DATA / "models" / f"{name_or_path}.yaml"
        return _validate(ModelSpec, read_structured(f"{name_or_path}.yaml", f.read_text()),
                         f"{name_or_path}.yaml")
    raise SpecError(str(name_or_path), None,
                    f"no such file or built-in model preset (built-in: {', '.join(builtin_models())})")


def load_plan(path: str | os.PathLike) -> Plan:
    """A Plan from its JSON file."""
    return _validate(Plan, read_structured(path), str(path))


def _is_gguf(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def output_file(path: str | os.PathLike) -> Path:
    """`path` ready to be written: its folder made; a SpecError naming it when it is a folder or its
    folder cannot be made (a file stands in the way, no permission)."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(str(path), None, "is a folder, not a file")
    above = next((q for q in path.parents if q.exists()), None)  # the nearest part of the path that exists
    if above is not None and not above.is_dir():
        raise SpecError(str(path), None, f"cannot make its folder: {above} is a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(str(path), None, f"cannot make its folder: {e.strerror or e}") from None
    return path


def output_folder(path: str | os.PathLike) -> Path:
    """Folder `path` made (with its parents); a SpecError naming it when a file stands there or it cannot be made."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise SpecError(str(path), None, "is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(str(path), None, f"cannot make the folder: {e.strerror or e}") from None
    return path


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (temporary file in the same folder, then rename)."""
    path = output_file(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def dump_plan(plan: Plan) -> str:
    """A Plan as indented JSON text."""
    return json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"


def dump_hardware(hw: HardwareSpec) -> str:
    """A HardwareSpec as YAML text (figures keep their provenance)."""
    return yaml.safe_dump(hw.to_yaml_dict(), sort_keys=False)
