"""Data: train loaders rebuilt to resume exactly, per-sample seeds (plain PyTorch, sampling.py), k-fold splits."""
