"""Exact resume and durability: `last.ckpt` and the random generators, atomic writes, stop signals, one fit per run
directory, and what may change when a run resumes."""
