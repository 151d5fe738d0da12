"""verl_top.ui package."""
