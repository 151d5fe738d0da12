"""``python -m verl_top.agent ARGS``: the agent from this checkout (no SSH, no zip)."""

import sys

from .main import run

run(sys.argv[1:])
