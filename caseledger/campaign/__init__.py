"""Campaigns: a base case, axes, a search and an objective frozen as one object (model, store, schema), its planner
and strategies (plan, search), and its answer (view, html)."""
