"""Ablation sweeps: `runner` runs them and keeps records, `report` reads the records."""
