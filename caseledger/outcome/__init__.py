"""From results to what a reader needs: the decision (decide), a run's figures by window and section (figures: what
report.md renders and summarize answers with), report.md/report.json (report), the run's time ledger and headline
figures (summary). The views over a scenario (its answer, HANDOFF.md) are in caseledger.views."""
