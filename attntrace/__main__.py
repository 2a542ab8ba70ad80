from attntrace.cli import main
import sys

sys.exit(main())
