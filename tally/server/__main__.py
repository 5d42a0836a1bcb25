"""`python -m tally.server ...`: the same as `tally serve ...` (LocalCluster starts servers so)."""

import sys

from tally.server.process import main

sys.exit(main())
