"""From results to what a reader needs: the decision (decide), report.md/report.json (report), the run's
time ledger and headline figures (summary), and HANDOFF.md (handoff)."""
