"""Ad-hoc variants of the MLP in one kernel, paired as benchmarks/fused_prefetch.py pairs its sets."""
import sys
sys.path.insert(0, "benchmarks")
import fused_prefetch as fp
from harness.kernels import fused_decode as fd

ON = dict(MLP_IN_ONE_MAX_ROWS=8, MLP_DOWN_TO_L2=False)
fp.DEFAULTS.update({k: getattr(fd, k) for k in ("MLP_VALUES_A_THREAD", "MLP_WARPS")})
fp.DEFAULTS["MLP_MIN_COLUMNS"] = fd.MLP_MIN_COLUMNS
MORE = dict(ON, MLP_PROGRAMS=4 * fd.SMS)
MOST = dict(ON, MLP_PROGRAMS=8 * fd.SMS, MLP_MIN_COLUMNS=4)
fp.VARIANTS = [("gate/up, then down (the default)", [], {}),
               ("MLP in one, 4 programs an SM's worth of columns", [], MORE),
               ("... and 128 values a thread", [], dict(MORE, MLP_VALUES_A_THREAD=128)),
               ("MLP in one, 8 programs an SM's worth, 4 columns at least", [], MOST),
               ("... and 128 values a thread", [], dict(MOST, MLP_VALUES_A_THREAD=128)),
               ("... and 128 values a thread, 4 warps", [], dict(MOST, MLP_VALUES_A_THREAD=128, MLP_WARPS=4))]
fp.main(sys.argv[1:])
