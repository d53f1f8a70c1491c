"""The GGUF output types dockyard can produce, and which tool produces each."""

from __future__ import annotations

from enum import StrEnum


class GgufExportError(Exception):
    """A GGUF could not be produced (unsupported model, missing tool, failed conversion)."""


class MissingGgufDependencyError(GgufExportError, ImportError):
    """The requested output type needs a package or tool that is not installed."""


class QuantType(StrEnum):
    """Output types. Float and gguf-py block types are written natively; K-quants need llama.cpp."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    Q8_0 = "Q8_0"
    Q4_0 = "Q4_0"
    Q4_1 = "Q4_1"
    Q5_0 = "Q5_0"
    Q5_1 = "Q5_1"
    Q2_K = "Q2_K"
    Q3_K_S = "Q3_K_S"
    Q3_K_M = "Q3_K_M"
    Q3_K_L = "Q3_K_L"
    Q4_K_S = "Q4_K_S"
    Q4_K_M = "Q4_K_M"
    Q5_K_S = "Q5_K_S"
    Q5_K_M = "Q5_K_M"
    Q6_K = "Q6_K"

    @classmethod
    def parse(cls, value: str | QuantType) -> QuantType:
        if isinstance(value, QuantType):
            return value
        try:
            return cls(value.strip().upper())
        except ValueError:
            names = ", ".join(member.value for member in cls)
            raise GgufExportError(f"unknown GGUF type {value!r}; expected one of {names}") from None

    @property
    def is_float(self) -> bool:
        return self in (QuantType.F32, QuantType.F16, QuantType.BF16)

    @property
    def numpy_quantizable(self) -> bool:
        """gguf-py can quantize these in numpy (it only dequantizes K-quants)."""
        return self in _NUMPY_TYPES

    @property
    def llama_cpp_converter_outtype(self) -> str | None:
        """The ``--outtype`` of llama.cpp's convert_hf_to_gguf.py, when it writes this directly."""
        return self.value.lower() if self in (*_FLOAT_TYPES, QuantType.Q8_0) else None


_FLOAT_TYPES = (QuantType.F32, QuantType.F16, QuantType.BF16)
_NUMPY_TYPES = (
    *_FLOAT_TYPES,
    QuantType.Q8_0,
    QuantType.Q4_0,
    QuantType.Q4_1,
    QuantType.Q5_0,
    QuantType.Q5_1,
)
