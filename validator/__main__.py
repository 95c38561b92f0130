"""``python -m validator``: the same as the ``validator`` command."""

import sys

from validator.app.cli import main

sys.exit(main())
