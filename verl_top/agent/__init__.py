"""verl_top.agent package."""
