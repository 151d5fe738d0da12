"""verl_top.sources package."""
