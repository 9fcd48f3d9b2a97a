import sys

from wharf.tasks.factory.cli import main

sys.exit(main())
