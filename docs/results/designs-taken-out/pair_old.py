"""This code's fused step against f561a71's fused_decode.py (gpu/old_fused_decode.py), paired as
benchmarks/fused_prefetch.py pairs its variants: the old decoder stands in for the new where its variant is built."""
import importlib.util
import sys

sys.path.insert(0, "benchmarks")
import fused_prefetch as fp  # noqa: E402
from harness.kernels import fused_decode  # noqa: E402

spec = importlib.util.spec_from_file_location("old_fused_decode", "gpu/old_fused_decode.py")
old = importlib.util.module_from_spec(spec)
sys.modules["old_fused_decode"] = old
spec.loader.exec_module(old)
fp.DEFAULTS["FusedDecoder"] = fused_decode.FusedDecoder
fp.VARIANTS = [("this code (a233fad on)", [], {}), ("f561a71's fused_decode.py", [], {"FusedDecoder": old.FusedDecoder})]
fp.main(sys.argv[1:])
