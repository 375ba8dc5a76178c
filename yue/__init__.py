"""yue: fast text generation with an AR-NAR Mixture-of-Transformers."""

__version__ = "0.1.0"
