import sys

from splitrt.cli.app import main

sys.exit(main())
