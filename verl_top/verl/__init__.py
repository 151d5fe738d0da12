"""verl_top.verl package."""
