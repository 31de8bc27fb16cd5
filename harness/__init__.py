"""harness: what CUDA Graph capture buys in LLM decode, swept with Hydra and tracked in MLflow."""
__version__ = "0.1.0"
