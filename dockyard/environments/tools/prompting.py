"""What a run's prompts say about its tools (:class:`~dockyard.data.tool_turns.ToolPrompts`),
from its configuration: the trainer's datasets and the dispatcher's are rendered alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dockyard.data.tool_turns import ToolPrompts
from dockyard.environments.tools.toolbox import UnknownToolboxError, described_tools

if TYPE_CHECKING:
    from dockyard.config.master import MasterConfig

DESCRIBE_KEY = "grpo.structured_tool_use.describe_tools"


def tool_prompts(config: MasterConfig) -> ToolPrompts | None:
    """None without structured tool use; ValueError naming :data:`DESCRIBE_KEY` when a tool
    environment's toolbox is not in this build (served elsewhere: its tools are unknown here)."""
    tools = config.grpo.structured_tool_use
    if not tools.enabled:
        return None
    data = config.data
    sections = [section for section in (data.train, data.validation) if section is not None]
    environments = [section.env or data.default_env for section in sections]
    try:
        described = described_tools(tools.describe_tools, environments)
    except UnknownToolboxError as error:
        raise ValueError(
            f"{DESCRIBE_KEY}: {error}: its tools cannot be described here (set it false and "
            "describe them in the prompts)"
        ) from None
    return ToolPrompts(tools.tool_call_format, described)
