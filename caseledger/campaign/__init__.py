"""Campaigns: a base case, axes, a search and an objective frozen as one object (model, store, schema), its planner,
drift rule and strategies (planner, drift, search), and its answer (view, html)."""
