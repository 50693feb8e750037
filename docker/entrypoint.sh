#!/bin/bash
# No arguments, key=value overrides or flags: run the training module with them.
# Anything else is a command (torchrun, python, bash, ...), run as given.
set -e
if [ $# -eq 0 ] || [[ "$1" == *=* ]] || [[ "$1" == -* ]]; then
  exec python -m train "$@"
fi
exec "$@"
