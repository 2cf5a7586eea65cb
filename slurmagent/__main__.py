import sys

from slurmagent.cli import main

sys.exit(main())
