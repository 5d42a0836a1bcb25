"""`python -m tally.cli ...`: the `tally` command, where its script is not on the PATH (how
LocalCluster starts a tiering process)."""

import sys

from tally.cli.main import main

sys.exit(main())
