"""``python -m localsgd`` is the ``localsgd`` command."""

import sys

from localsgd.cli import main

sys.exit(main())
