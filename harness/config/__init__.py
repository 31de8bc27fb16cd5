"""The run's configuration: the schema (every key and default, once), validation before anything is created,
and the run's label. Imports no torch: the command line checks a config before anything heavy loads."""
from harness.config.schema import (CONF_DIR, GROUPS, DType, ModelConfig, RunConfig, config_hash,
                                   identity, round_up)

__all__ = ["CONF_DIR", "GROUPS", "DType", "ModelConfig", "RunConfig", "config_hash", "identity",
           "round_up"]
