import sys

from simagent.cli import main

sys.exit(main())
