import sys

from hetsim.cli import main

sys.exit(main())
