"""`python3 -m coderun.sandbox.runner`. The sandbox images ship the package's directories under /opt/coderun with
a copy of this file beside them, and run `python3 -I /opt/coderun`: the path is /opt/coderun and the standard
library, whatever the working directory, and no PYTHON* variable is read. Imported under its own name (as the
images' build does, to check its byte-code), it runs nothing."""
import sys

from coderun.sandbox.runner.main import main

if __name__ == "__main__":
    sys.exit(main())
