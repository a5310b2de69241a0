import sys
from pathlib import Path

# Tests import the top-level modules (obfs2, socks, obfsproxy) and the harness.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
