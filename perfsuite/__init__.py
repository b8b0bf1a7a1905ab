"""perfsuite: a pytest-based performance regression suite for multi-GPU machine learning."""

__version__ = "0.1.0"
