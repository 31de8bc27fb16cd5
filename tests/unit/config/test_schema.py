"""harness/config/schema.py: the cache's length from the context."""
from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.config.validate import check_overrides
from tests.support import run_config


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


def test_cache_len_follows_from_the_context_unless_given():
    assert run_config("context_len=1000").cache_len == 1280  # 1000 + 10 + 128, rounded up to 256
    assert run_config("context_len=16").cache_len == 256
    assert run_config("context_len=1000", "cache_len=4096").cache_len == 4096
    with pytest.raises(ConfigError, match=r"cache_len=1100 is too short: context_len \(1000\) .* use cache_len>=1138"):
        run_config("context_len=1000", "cache_len=1100")
    with pytest.raises(ConfigError, match=r"cache_len=1100 is invalid with attn=flex: .* \(e.g. 1152\)"):
        run_config("attn=flex", "cache_len=1100")
    with pytest.raises(ConfigError, match="prompt_len is now called context_len: use context_len=N"):
        check_overrides(["prompt_len=16"])
