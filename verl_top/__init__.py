"""verl-top: a live terminal monitor that tells why a verl training job is slow."""

__version__ = "0.1.0"
