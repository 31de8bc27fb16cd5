"""harness: what CUDA Graph capture buys in LLM decode, swept with Hydra and tracked in MLflow."""
import os

__version__ = "0.1.0"
# The variables set before anything imported torch, whose import chain sets some of its own
ENV_AT_START = frozenset(os.environ)
