"""``python -m dockyard`` is the ``dockyard`` command."""

import sys

from dockyard.cli import main

sys.exit(main())
