import sys

from controller.serve import main

sys.exit(main())
