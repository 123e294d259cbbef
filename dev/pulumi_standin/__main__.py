"""`python -m pulumi_standin ...`: see dev/pulumi_standin/cli.py."""

import sys

from pulumi_standin import _sigint  # stdlib only: the package's __init__ imports lazily

_sigint.install()  # before the SDK loads: a Ctrl-C from here on is a flag, never lost

from pulumi_standin.cli import main  # noqa: E402

sys.exit(main())
