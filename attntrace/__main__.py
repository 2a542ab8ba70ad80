"""`python -m attntrace`: the command line (see attntrace.cli).

The cyclic garbage collector is off from the first import: start-up allocates tens of thousands
of objects that live until exit (modules, classes, functions, compiled templates), and each
collection walks all of them again. `cli.main` keeps it off for the command (see there)."""

import gc

gc.disable()

import sys  # noqa: E402

from attntrace.cli import main  # noqa: E402

sys.exit(main())
