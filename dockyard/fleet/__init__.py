"""``dockyard run``: a whole fleet on one machine — broker, trainer, rollout workers, scorers —
as separate processes, supervised, with a live progress display."""
