"""Tools an agent calls during a multi-turn episode: parsing its calls, running them.

- :mod:`calls`: the model's text → tool calls (``grpo.structured_tool_use.tool_call_format``:
  ``hermes`` or ``openai``), malformed calls reported, never guessed; the thinking-block check.
- :mod:`toolbox`: the per-episode tool session interface, the registry of toolboxes by
  environment name, and :func:`run_tool_call`, which turns whatever a tool does (answers,
  raises, hangs, floods, writes invalid UTF-8) into an observation or a typed failure.
- :mod:`calculator`: the demo's toolbox.

Transport-free like every environment: the rollout worker runs the episode loop, a tool service
(another process) may stand behind a session.
"""
