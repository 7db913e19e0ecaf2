import sys

from controller.runtime.serve import main

sys.exit(main())
