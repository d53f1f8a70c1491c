"""A vision-language policy never writes an image: the torch engine does not sample Qwen2-VL's
placeholder tokens, even from a policy that puts all its mass on them (a random tiny VLM does
sample them, and a placeholder run without pixels breaks the next turn and the trainer).

The policy is the scripted one (stand-in, named as such: tests/unit/producers/scripted_policy.py)
in the real engine; the tokenizer and processor are the tiny Qwen2-VL's."""

from __future__ import annotations

import asyncio
import math

from dockyard.engines.base import GenerationRequest, SamplingParams
from dockyard.models.tiny_vlm import build_qwen2_vl_processor, build_qwen2_vl_tokenizer
from tests.unit.producers.scripted_policy import scripted_vision_engine

PLACEHOLDERS = "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>"


def test_the_placeholder_tokens_are_never_sampled_however_likely():
    processor = build_qwen2_vl_processor(build_qwen2_vl_tokenizer())
    tok = processor.tokenizer
    engine = scripted_vision_engine([PLACEHOLDERS], processor)
    prompt = tok.encode("Draw.", add_special_tokens=False)
    [result] = asyncio.run(
        engine.generate(
            [GenerationRequest(prompt, "r0")],
            SamplingParams(max_new_tokens=4, seed=0, ignore_eos=True),
            1,
        )
    )
    never = {
        processor.image_token_id,
        processor.vision_start_token_id,
        processor.vision_end_token_id,
    }
    assert result.num_tokens == 4
    assert never.isdisjoint(int(token) for token in result.token_ids)
    # Drawn from what is left: every other token has logit 0, so each is one of len(tok) - 3.
    assert [round(float(p), 4) for p in result.logprobs] == [round(-math.log(len(tok) - 3), 4)] * 4
