"""Generation engines behind one async interface (:class:`GenerationEngine`).

``torch`` (in process, the CPU default), ``vllm`` (in process or a remote server) and
``sglang`` (a remote server); :func:`create_engine` picks one from ``policy.generation``.
Backend modules import their heavy dependencies lazily: importing this package is cheap.
"""

from dockyard.engines.base import (
    EngineError,
    EngineHealth,
    FinishReason,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    GenerationTimings,
    InflightRefitPolicy,
    InvalidSamplingParams,
    SamplingParams,
    WeightSource,
)
from dockyard.engines.factory import create_engine
from dockyard.engines.sampling import make_sampling_params, sampling_params_from_config

__all__ = [
    "EngineError",
    "EngineHealth",
    "FinishReason",
    "GenerationEngine",
    "GenerationRequest",
    "GenerationResult",
    "GenerationTimings",
    "InflightRefitPolicy",
    "InvalidSamplingParams",
    "SamplingParams",
    "WeightSource",
    "create_engine",
    "make_sampling_params",
    "sampling_params_from_config",
]
