"""A group's message ids, and the group id read back out of them."""

from __future__ import annotations

import pytest

from dockyard.schemas import PromptGroup, Rollout, ScoredRollout
from dockyard.schemas.prompt import group_id_of
from tests.unit.schemas.schema_factories import make_prompt_group

GROUP_MESSAGES = (PromptGroup.SCHEMA_NAME, Rollout.SCHEMA_NAME, ScoredRollout.SCHEMA_NAME)


@pytest.mark.parametrize("schema", GROUP_MESSAGES)
def test_the_group_id_comes_back_even_with_colons_in_it(schema):
    group = make_prompt_group(group_id="run-7:e0:i12", attempt=3)
    assert group_id_of(group.message_id_as(schema), GROUP_MESSAGES) == "run-7:e0:i12"


@pytest.mark.parametrize(
    "message_id",
    ["weight_version:4", "dead_letter:scorer:id=x", "rollout:g1", "rollout::3", "rollout:g:x", ""],
)
def test_other_message_ids_have_no_group(message_id):
    assert group_id_of(message_id, GROUP_MESSAGES) is None
