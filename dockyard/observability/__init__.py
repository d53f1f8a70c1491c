"""What a run tells the outside about itself: Prometheus metrics (:mod:`.prometheus`), traces
(:mod:`.tracing`), the training metrics loggers (:mod:`.metrics`: W&B, MLflow, TensorBoard,
...) and the role status files a supervisor reads (:mod:`.status_files`). Every layer from the
broker up uses them; they import only ``config`` and ``utils.logging``."""
