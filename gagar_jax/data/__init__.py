"""TFDS builders (array_record, no TensorFlow) and grain pipelines for the task suites."""
