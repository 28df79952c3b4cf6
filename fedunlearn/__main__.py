import sys

from fedunlearn.cli import main

sys.exit(main())
