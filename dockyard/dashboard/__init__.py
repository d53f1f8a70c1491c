"""``dockyard dashboard``: a small web page over a run's metrics and the fleet's data plane."""
