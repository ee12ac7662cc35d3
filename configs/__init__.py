"""ml_collections experiment configs: each file has `get_config(arg)`."""
