"""specdec: an open course on speculative decoding and multi-token prediction."""

__version__ = "0.1.0"
