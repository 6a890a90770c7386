"""``python -m promshift.local``: the lab's command line (``stack`` plus the production commands)."""

import sys

from promshift.local.cli import main

sys.exit(main())
