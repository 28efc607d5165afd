"""Campaigns: a base case, axes, a search and an objective frozen as one object (model, store, schema), its planner,
drift rule and strategies (plan, drift, search), and its answer (view, html)."""
