"""``python -m normx.cli``: the command line (torchrun / accelerate launch run it this way)."""

from normx.cli.main import main

raise SystemExit(main())
