"""localsgd: local SGD and hierarchical local SGD in PyTorch."""

__version__ = "0.1.0"
