"""``python -m rolloutd.cli``: the ``rolloutd`` command."""

import sys

from rolloutd.cli.entry import main

sys.exit(main())
