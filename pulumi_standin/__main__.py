"""`python -m pulumi_standin ...`: see pulumi_standin/cli.py."""

import sys

from pulumi_standin.cli import main

sys.exit(main())
