#!/bin/bash
# Runs the hidden tests (copied to /tests only after the agent has finished) and writes the share
# that passed as the reward: Harbor's reward.txt convention.
cd /app
python3 /tests/test_calc.py > /logs/verifier/test-stdout.txt 2>&1
python3 - <<'PY'
import re
out = open("/logs/verifier/test-stdout.txt").read()
ran = int(re.search(r"Ran (\d+) test", out).group(1))
bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", out))
open("/logs/verifier/reward.txt", "w").write(f"{(ran - bad) / ran}\n")
PY
