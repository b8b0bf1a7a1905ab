"""``python -m perfsuite``: the ``perfsuite`` command."""

import sys

from perfsuite.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
