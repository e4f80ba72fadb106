#!/bin/sh
# A gpuguard check plugin (exit-code convention, docs/checks.md "Custom checks"):
# every path given must be a mount point that answers. A training job reading its data
# or writing checkpoints from a gone or hung shared file system fails or stalls, with no
# GPU at fault.
#   exit 0: every mount answers; exit 1: one does not (stdout says which);
#   a mount that hangs is killed at the plugin's timeout_s and reads as Unknown.
set -u
if [ "$#" -eq 0 ]; then
    echo "usage: mount-responsive.sh MOUNTPOINT..." >&2
    exit 2
fi
for path in "$@"; do
    if ! mountpoint -q "$path"; then
        echo "$path is not mounted"
        exit 1
    fi
    if ! ls "$path" > /dev/null 2>&1; then
        echo "$path is mounted but cannot be listed"
        exit 1
    fi
done
exit 0
