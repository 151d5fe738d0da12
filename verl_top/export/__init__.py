"""verl_top.export package."""
