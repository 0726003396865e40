import sys

from wattprint.cli.main import main

sys.exit(main())
