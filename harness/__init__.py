"""harness: what CUDA Graph capture buys in LLM decode, swept with Hydra and tracked in MLflow."""
import os

__version__ = "0.1.0"
# The variables set before anything imported torch, whose import chain sets some of its own
ENV_AT_START = frozenset(os.environ)

# Without an NVIDIA GPU, Triton runs kernels only in its interpreter, a choice it reads when its kernels are
# defined (at its import, which torch's and transformers' imports trigger): made here, first, so that
# attn=triton-decode runs on a CPU (slowly: tests), as flex's reference does. (No torch here: importing
# the config must stay cheap.)
if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version")):
    os.environ.setdefault("TRITON_INTERPRET", "1")
