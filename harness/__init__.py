"""harness: what CUDA Graph capture buys in LLM decode, swept with Hydra and tracked in MLflow.

Importing it changes nothing in the environment (Triton's interpreter is chosen by the kernel modules that need
it, harness/kernels/triton_runtime.py)."""
import os

__version__ = "0.1.0"
# The variables set before anything imported torch, whose import chain sets some of its own
ENV_AT_START = frozenset(os.environ)
