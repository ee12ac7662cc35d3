"""Sweep files: get_sweep(arg) -> {"runs": [...], "seeds": [...]}."""
