"""A hardware figure that carries where it came from (LLM-Viewer style provenance).

`Figure` is a float: code does arithmetic on it directly; `.source` says datasheet, reported,
assumed or measured, and `.ref` the document, or the date and method of a measurement.
In YAML a figure is written `{value: 936, source: datasheet, ref: "NVIDIA RTX 3090 spec"}`.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

Source = Literal["datasheet", "reported", "assumed", "measured", "derived"]
SOURCES = ("datasheet", "reported", "assumed", "measured", "derived")


class Figure(float):
    """A float with provenance: `source` in SOURCES and a free-text `ref`."""

    source: str
    ref: str

    def __new__(cls, value: float, source: str = "assumed", ref: str = ""):
        if source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)} (got {source!r})")
        if source in ("reported", "measured") and not ref:
            raise ValueError(f"a {source} figure needs a ref (document, or date and method)")
        obj = super().__new__(cls, value)
        obj.source, obj.ref = source, ref
        return obj

    def __repr__(self) -> str:
        return f"Figure({float(self)!r}, {self.source!r})"

    def with_value(self, value: float) -> "Figure":
        """The same provenance with another value (what-if scaling keeps the source)."""
        return Figure(value, self.source, self.ref)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": float(self), "source": self.source}
        if self.ref:
            out["ref"] = self.ref
        return out

    @classmethod
    def _validate(cls, v: Any) -> "Figure":
        if isinstance(v, Figure):
            return v
        if isinstance(v, dict):
            unknown = set(v) - {"value", "source", "ref"}
            if unknown:
                raise ValueError(f"unknown key(s) {sorted(unknown)} in figure")
            if "value" not in v or "source" not in v:
                raise ValueError("a figure needs 'value' and 'source'")
            value = v["value"]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"value must be a number (got {value!r})")
            return cls(float(value), str(v["source"]), str(v.get("ref", "")))
        raise ValueError("a figure is {value, source, ref}: every hardware figure carries its source")

    @classmethod
    def __get_pydantic_core_schema__(cls, _source: Any, _handler: GetCoreSchemaHandler):
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda f: f.to_dict()),
            json_schema_input_schema=core_schema.typed_dict_schema({
                "value": core_schema.typed_dict_field(core_schema.float_schema()),
                "source": core_schema.typed_dict_field(core_schema.literal_schema(list(SOURCES))),
                "ref": core_schema.typed_dict_field(core_schema.str_schema(), required=False),
            }),
        )
