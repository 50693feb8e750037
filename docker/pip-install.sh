#!/bin/bash
# pip install inside the image build. pip reads PIP_INDEX_URL, PIP_EXTRA_INDEX_URL,
# PIP_FIND_LINKS and PIP_CERT itself; build arguments left empty are unset first, since
# pip would take an empty value literally.
set -euo pipefail
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_CERT; do
  if [ -z "${!var:-}" ]; then unset "$var"; fi
done
exec pip install "$@"
