"""Entry points: the Hydra task and its sweep callback, the subcommands, one-line errors, exit codes."""

COMMANDS = ("report", "rerun", "sync", "compare", "ab", "export", "ui", "plan")  # the subcommands of harness/cli/commands.py
