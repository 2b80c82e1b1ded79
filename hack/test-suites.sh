#!/usr/bin/env bash
# Runs the test module's suites one at a time: each starts its own control plane or measures
# time, and two at once on two cores make both slow and the timings meaningless. Each suite has a
# -timeout of at least about twice what it takes on an idle 2-core machine (the figure beside it,
# seconds, from make test's own output), and a few minutes for the short ones; a suite that
# outlives it says so (test/harness/reaper.go).
# After each suite, nothing it started may still run.
set -euo pipefail
cd "$(dirname "$0")/../test"

# suite  typical-seconds  timeout  [go test flags]
suites=(
  "./harness        120  8m"
  "./stack           50  3m"
  "./equivalence     10  3m"
  "./e2e             45  5m"
  "./install        175  8m"
  "./demo            70  5m"
  "./bench          505 20m -v"
  "./faults           5  3m -run ^TestCheck"
  "./faults         430 15m -run TestFaults/^(kills|rejected-after-mutation|leader-loss|api-faults)$"
  "./integration    360 12m -v"
  "./ipamrace        40  5m -v"
)

# Every package of the test module with tests is in the list: a new one must be given its budget here.
listed=$(for s in "${suites[@]}"; do read -r pkg _ <<<"$s"; echo "${pkg#./}"; done | sort -u)
module=$(go list -m)
present=$(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... | sed "s|^$module/||" | sort)
if [[ "$listed" != "$present" ]]; then
  echo "hack/test-suites.sh lists: $(echo $listed); the test module has: $(echo $present)" >&2
  exit 1
fi

leftovers() {
  local marker=$1
  for env in /proc/[0-9]*/environ; do
    if tr '\0' '\n' 2>/dev/null <"$env" | grep -qxF "$marker"; then
      pid=${env#/proc/}
      pid=${pid%/environ}
      echo "$pid $(tr '\0' ' ' 2>/dev/null </proc/$pid/cmdline | cut -c1-120)"
    fi
  done
}

only=${SUITES:-}
failed=()
for s in "${suites[@]}"; do
  read -r pkg typical timeout flags <<<"$s"
  if [[ -n "$only" && " $only " != *" ${pkg#./} "* ]]; then
    continue
  fi
  marker="IP_PREALLOCATOR_SUITE=${pkg#./}-$$-$RANDOM"
  echo "=== suite test/${pkg#./} (typically ${typical}s, timeout $timeout)"
  start=$SECONDS
  rc=0
  # shellcheck disable=SC2086 # flags are words
  env "$marker" go test -count=1 -timeout "$timeout" $flags "$pkg" || rc=$?
  took=$((SECONDS - start))
  # The harness's reaper stops a dead suite's processes within a second or two.
  for _ in $(seq 20); do
    [[ -z "$(leftovers "$marker")" ]] && break
    sleep 0.5
  done
  left=$(leftovers "$marker")
  if [[ -n "$left" ]]; then
    echo "suite test/${pkg#./} left processes running; killing them:" >&2
    echo "$left" >&2
    kill -KILL $(cut -d' ' -f1 <<<"$left") 2>/dev/null || true
    rc=1
  fi
  if ((rc == 0)); then
    echo "=== suite test/${pkg#./}: ok in ${took}s"
  else
    echo "=== suite test/${pkg#./}: FAILED after ${took}s (timeout $timeout, load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    failed+=("test/${pkg#./}")
  fi
done
if ((${#failed[@]})); then
  echo "failed suites: ${failed[*]}" >&2
  exit 1
fi
