import sys

from handformer.cli import main

sys.exit(main())
