"""`python -m caseledger.target serve --host 127.0.0.1 --port P --model NAME [--config-json JSON]`."""

import sys

from caseledger.target.server import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
