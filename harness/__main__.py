"""`python -m harness ...` and the `harness` command: the command line of harness/cli/main.py."""
import sys

from harness.cli.main import main as _main


def main() -> None:
    sys.exit(_main())


if __name__ == "__main__":
    main()
