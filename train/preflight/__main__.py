import sys

from train.preflight.check import main

sys.exit(main())
