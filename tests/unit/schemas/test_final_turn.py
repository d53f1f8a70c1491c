"""What a scorer reads of an episode: its last model turn is the answer (docs/multiturn.md)."""

from __future__ import annotations

import msgspec
import numpy as np
from schema_factories import make_rollout

from dockyard.consumers.score_conversion import to_scoring_group
from dockyard.models import load_tokenizer
from dockyard.schemas import Segment


def test_an_episode_s_last_assistant_segment_is_its_final_turn() -> None:
    tok = load_tokenizer("tiny://qwen2-calculator")

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    call, observation, answer = ids("12*3"), ids("36"), ids("36")
    tokens = call + observation + answer
    cuts = np.cumsum([0, len(call), len(observation), len(answer)])
    segments = [
        Segment(role="assistant", start=int(cuts[0]), end=int(cuts[1])),
        Segment(role="tool", start=int(cuts[1]), end=int(cuts[2])),
        Segment(role="assistant", start=int(cuts[2]), end=int(cuts[3])),
    ]
    rollout = make_rollout(num_samples=2, length=len(tokens))
    episode = msgspec.structs.replace(
        rollout.samples[0], response_token_ids=np.array(tokens, dtype=np.int64), segments=segments
    )
    rollout = msgspec.structs.replace(rollout, samples=[episode, rollout.samples[1]])

    first, single = to_scoring_group(rollout, tok).samples
    assert first.response_text == "12*33636"
    assert first.final_turn_text == "36" and first.answer_text == "36"
    # A single turn has no segments: its whole response is its answer.
    assert single.final_turn_text is None and single.answer_text == single.response_text
