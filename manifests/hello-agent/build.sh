#!/bin/sh
# The hello agent's build step: runs in a fresh generation while the old one serves.
set -e
echo "building the hello agent"
date -u +%Y-%m-%dT%H:%M:%SZ > build-info.txt
