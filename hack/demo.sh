#!/usr/bin/env bash
# make demo: the fleet simulator on the default scenario and on the public StepFun fault
# trace (no remediation, a reactive setup and gpuguard on the same failures), then the example nodes: a healthy node passes and
# broken ones are caught. Fails if a verdict is not the one the example was made to show.
set -u
gpuguard="$1"
expect=(--expected-gpus 1 --expected-nics 3 --expected-link-gbps 400)
status=0

echo "=== A year of a 256-node GPU fleet (after a warm-up), and a real year's faults, three ways (gpuguard simulate)"
echo "\$ gpuguard simulate --trace infinitehbd --html out/simulation.html"
"$gpuguard" simulate --trace infinitehbd --html out/simulation.html || status=1

show() {
  local bundle="$1" want="$2" description="$3"
  echo
  echo "=== $description"
  echo "\$ gpuguard check --bundle $bundle ${expect[*]}"
  "$gpuguard" check --bundle "$bundle" "${expect[@]}"
  local got=$?
  echo "(exit status $got)"
  if [ "$got" -ne "$want" ]; then
    echo "demo: expected exit status $want for $bundle, got $got" >&2
    status=1
  fi
}

show examples/healthy-h100 0 "A healthy H100 node"
show examples/xid79-fallen-off-bus 2 "A node whose GPU fell off the bus (Xid 79, NVSwitch SXid 20034)"
show examples/ib-link-half-rate 2 "A node with an InfiniBand port up but at half its rate"
echo
echo "=== What gpuguard does about an Xid"
echo "\$ gpuguard xid 79"
"$gpuguard" xid 79
exit "$status"
