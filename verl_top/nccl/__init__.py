"""verl_top.nccl package."""
