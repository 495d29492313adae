"""Training: the engine's Trainer and its defaults, the training recipe for any module, the warmup-cosine schedule,
the monitored metric, and how the global batch is laid out over the processes."""
