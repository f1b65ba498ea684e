"""``python -m rehearsal.faults``: ``cli.main``."""

import sys

from .cli import main

sys.exit(main())
