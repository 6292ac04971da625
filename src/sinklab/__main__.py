"""``python -m sinklab``: the same command line as the ``sinklab`` script."""

import sys

from sinklab.cli import main

sys.exit(main())
