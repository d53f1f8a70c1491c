"""A teacher served as an engine server (issue #27): ``dockyard model serve`` in its own process,
asked over HTTP for ``prompt_logprobs`` the way vLLM's OpenAI server is, gives the log-probs of a
direct forward of the same model; requests it cannot answer exactly are refused with a reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from dockyard.engines.prompt_logprobs_client import PromptLogprobsClient
from dockyard.fleet.teacher_servers import TeacherServer, TeacherServerError, teacher_server
from dockyard.models.tiny import build_arithmetic_policy, save_policy
from tests.integration.roles.factories import TOKENIZER
from tests.integration.roles.test_teacher_routing import direct_logprobs

SEED = 1


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = build_arithmetic_policy(SEED)
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("teacher") / "model")


@pytest.fixture(scope="module")
def served(teacher_dir: Path) -> Iterator[TeacherServer]:
    with teacher_server(teacher_dir, "float32", teacher_dir.parent / "server.log") as server:
        yield server


def ids(text: str) -> np.ndarray:
    return np.asarray(TOKENIZER(text)["input_ids"], dtype=np.int64)


@pytest.mark.slow
async def test_served_logprobs_equal_a_direct_forward_of_the_model(
    served: TeacherServer, teacher_dir: Path
) -> None:
    prompt = ids("12+34=")
    # Lengths differ so the server batches with padding; batch_size 2 splits them in requests.
    responses = [ids("46"), ids("4699"), ids(""), ids("7")]
    client = PromptLogprobsClient(served.url, str(teacher_dir), timeout_s=60, batch_size=2)
    try:
        got = await client.continuation_logprobs(prompt, responses)
    finally:
        await client.aclose()
    model, _ = build_arithmetic_policy(SEED)
    for response, values in zip(responses, got, strict=True):
        assert values.shape == response.shape
        if len(response):
            # float32 forwards of the same weights; only the batch padding differs.
            expected = direct_logprobs(model, prompt, response)
            np.testing.assert_allclose(values, expected, atol=1e-5)
            assert np.abs(expected).max() > 1e-3  # a random model: not trivially zero


def completion(served: TeacherServer, **body: object) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/completions", json=body, timeout=60)


@pytest.mark.parametrize(
    ("change", "status", "reason"),
    [
        ({"max_tokens": 5}, 400, "max_tokens"),
        ({"temperature": 1.0}, 400, "temperature"),
        ({"prompt_logprobs": 3}, 400, "prompt_logprobs"),
        ({"logit_bias": {"4": 1.0}}, 400, "logit_bias"),
        ({"prompt": [[1, 2, 999]]}, 400, "outside the vocabulary"),
        ({"prompt": [[]]}, 400, "prompt 0 is empty"),
        ({"model": "someone-else"}, 404, "someone-else"),
    ],
)
@pytest.mark.slow
def test_a_request_it_cannot_answer_exactly_is_refused_with_the_reason(
    served: TeacherServer, teacher_dir: Path, change: dict[str, object], status: int, reason: str
) -> None:
    body = {"model": str(teacher_dir), "prompt": [1, 2, 3], "max_tokens": 1, "prompt_logprobs": 0}
    reply = completion(served, **{**body, **change})
    assert reply.status_code == status
    assert reason in reply.json()["error"]["message"]


@pytest.mark.slow
def test_the_reply_has_vllms_shape(served: TeacherServer, teacher_dir: Path) -> None:
    prompt = ids("12+34=").tolist()
    reply = completion(
        served, model=str(teacher_dir), prompt=prompt, max_tokens=1, prompt_logprobs=0
    )
    assert reply.status_code == 200
    (choice,) = reply.json()["choices"]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None
    for token, entry in zip(prompt[1:], entries[1:], strict=True):
        (value,) = entry.values()
        assert list(entry) == [str(token)] and value["rank"] >= 1 and value["logprob"] <= 0
    # The one completion token is the greedy next token of the same forward.
    model, _ = build_arithmetic_policy(SEED)
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor([prompt])).logits[0, -1]
    assert choice["token_ids"] == [int(torch.argmax(logits))]


def test_a_server_whose_model_cannot_load_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with (
        pytest.raises(TeacherServerError, match="before listening"),
        teacher_server(missing, "float32", tmp_path / "server.log"),
    ):
        pass
