import sys

from ascmem.cli import main

sys.exit(main())
