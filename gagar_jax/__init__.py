"""gagar_jax: GRPO with Groupwise Agentic Grading and Advantage Redistribution."""

__version__ = "0.1.0"
