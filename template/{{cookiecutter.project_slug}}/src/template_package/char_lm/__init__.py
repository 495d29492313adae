"""The example task: a character-level transformer language model on text that ships with Python. Yours to replace:
see the README, "Your own model and data"."""
