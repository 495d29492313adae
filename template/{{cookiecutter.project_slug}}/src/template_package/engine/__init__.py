"""The engine: everything a run needs beyond your model and data, for any LightningModule and LightningDataModule.

The command line and Trainer (cli.py, trainer.py), the training recipe (recipe.py, schedulers.py), train loaders that
resume exactly (loaders.py, sampling.py), exact resume and durable checkpoints (resume.py, durable.py, run_lock.py,
stop_signals.py, resume_checks.py), reporting (callbacks.py, loggers.py, monitor.py, flops.py), mistakes in one line
(checks.py, errors.py), and the tools: sweep.py, export.py, grad_norms.py, guarantees.py (the guarantee kit). It
imports nothing from the rest of the package, so it can be copied whole into another project.
"""
