"""Planning a fleet: a discrete-event simulation of dockyard's pipeline, calibrated on measured
runs (``dockyard simulate``; docs/operations.md, "Planning a fleet")."""
