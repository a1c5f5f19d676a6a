import sys

from harness.apps.cli import main

sys.exit(main())
