"""SWE-style patch scoring: the ``swe`` environment (client) and the sandbox service it calls."""
