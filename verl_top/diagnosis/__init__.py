"""verl_top.diagnosis package."""
