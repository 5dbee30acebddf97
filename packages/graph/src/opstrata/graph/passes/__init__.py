"""Optimisation passes, one module per pass, and the pipeline that runs them by level with a report."""
