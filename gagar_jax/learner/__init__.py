"""The GRPO/GAGAR learner: losses, train state, the jitted sharded step, checkpoints."""
