"""knowtrace-train: self-training retrieval-augmented LLMs that trace their own knowledge (KnowTrace)."""

__version__ = "0.1.0"
