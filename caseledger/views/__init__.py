"""The views over a scenario's cases and campaigns: the scenario answer, HANDOFF.md and their charts and pages.

Above `outcome` (a run's figures and decision) and `campaign` (a campaign's search and answer): a scenario's
view reads both, and neither reads it.
"""
