"""Widgets, grouped by domain: header, terminal, model calls, stats, cleanup, failures, timeline."""
