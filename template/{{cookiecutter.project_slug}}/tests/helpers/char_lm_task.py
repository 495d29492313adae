"""The example's classes and settings, given to the example's tests: configs/default.yaml in a project made with
the char_lm task; in the template, which keeps both tasks, the char_lm variant of it."""

from pathlib import Path

_VARIANT = Path(__file__).resolve().parents[2] / "configs" / "default.char_lm.yaml"
CHAR_LM = ["-c", str(_VARIANT)] if _VARIANT.is_file() else []
