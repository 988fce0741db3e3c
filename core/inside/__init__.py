"""Programs that run inside the sandbox, on the sandbox's own Python (stdlib only, >= 3.8).

They are uploaded as files and never imported by the engine for their behaviour; an import-linter
contract keeps them free of imports from the rest of ``core``.
"""

from pathlib import Path

INSIDE_DIR = Path(__file__).parent
