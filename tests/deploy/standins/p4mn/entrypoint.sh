#!/bin/sh
# p4mn's command line (`mn` with this stand-in's classes, then compose's arguments). p4mn
# runs privileged, with /proc/sys writable; where the engine cannot give all capabilities
# (tests/deploy/compose.emulated.yml gives NET_ADMIN and SYS_ADMIN instead), /proc/sys is
# read-only, and the hosts' sysctls (no IPv6) fail: made writable again first, before
# Mininet gives every host its own mount namespace.
set -eu
if grep -qE '^proc /proc/sys proc ro[ ,]' /proc/mounts; then
  mount -o remount,rw /proc/sys 2>/dev/null || echo "p4mn stand-in: /proc/sys stays read-only" >&2
fi
exec mn --custom /root/p4switch.py --switch simple_switch_grpc --host onoshost \
  --controller none "$@"
