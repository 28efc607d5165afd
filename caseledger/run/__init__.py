"""A run in motion: create and start it (start), the detached controller that holds the lease and runs the
phases in order (controller), the phase bodies (phases), and the fresh-process preflight (preflight).

Nothing is re-exported here: `python -m caseledger.run.controller` and the preflight process import only
what they use."""
