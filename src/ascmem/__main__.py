import sys

from ascmem.tools.cli import main

sys.exit(main())
