"""Allow ``python -m verl_top``."""

from verl_top.cli import main

raise SystemExit(main())
