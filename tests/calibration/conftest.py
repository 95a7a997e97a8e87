"""Makes the shared helpers in stored_runs.py importable under --import-mode=importlib."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
