"""harness/config/validate.py: a saved config read again."""
from __future__ import annotations

import pytest

from harness.config.validate import to_run_config
from tests.support import run_config


pytestmark = pytest.mark.usefixtures("fresh_model_cache")


def test_a_config_saved_with_prompt_len_reruns_as_context_len():
    saved = {"model": dict(run_config("model=tiny").model.__dict__), "bs": 2, "prompt_len": 8, "cache_len": 256}
    cfg = to_run_config(saved)
    assert (cfg.context_len, cfg.cache_len) == (8, 256)
