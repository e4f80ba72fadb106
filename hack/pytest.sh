#!/usr/bin/env bash
# Runs pytest; "no tests collected" (exit 5) is a failure, not a pass.
set -u
python="$1"; shift
"$python" -m pytest -q "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$status"
