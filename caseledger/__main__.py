"""`python -m caseledger` is the `caseledger` command."""

from caseledger.cli import main

raise SystemExit(main())
