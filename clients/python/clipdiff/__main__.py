"""``python -m clipdiff``: the ``clipdiff`` command line."""

import sys

from clipdiff.cli import main

sys.exit(main())
