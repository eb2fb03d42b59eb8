"""python -m pdscope: the same as the pdscope command."""

import sys

from pdscope.cli import main

sys.exit(main())
