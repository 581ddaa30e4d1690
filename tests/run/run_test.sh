#!/usr/bin/env bash
# tools_run_test: `memento run [options] -- COMMAND` (docs/python.md, "memento run").
set -euo pipefail
bin=$1
fail() { echo "tools_run_test: FAIL: $*" >&2; exit 1; }
root=$(mktemp -d /dev/shm/memento-run-test.XXXXXX)
rmdir "$root"  # the agent creates it (0700)
work=$(mktemp -d "${MEMENTO_TEST_TMPDIR:-/tmp}/run-test.XXXXXX" 2>/dev/null || mktemp -d)
cleanup() { [ -n "${sidecar:-}" ] && kill "$sidecar" 2>/dev/null; rm -rf "$root" "$root.agent.log" "$work"; }
trap cleanup EXIT

# 1. No command: usage error, exit 2, no agent started.
set +e; "$bin" run --job rt --root "$root" >"$work/out" 2>&1; rc=$?; set -e
[ "$rc" = 2 ] || fail "no command: exit $rc, expected 2: $(cat "$work/out")"
grep -q "no command" "$work/out" || fail "no command: message is $(cat "$work/out")"
[ ! -e "$root/agent.sock" ] || fail "an agent was started without a command"

# 2. Starts an agent, passes the environment, returns the command's exit
#    code, stops the agent; options after `--` belong to the command.
set +e
"$bin" run --job rt --root "$root" --remove-on-exit -- sh -c \
  'echo "job=$MEMENTO_JOB_ID dir=$MEMENTO_RUN_DIR"; test -S "$MEMENTO_RUN_DIR/agent.sock" && echo sock-ok; echo "$@"; exit 3' \
  sh --job not-memento >"$work/out" 2>&1
rc=$?; set -e
cat "$work/out"
[ "$rc" = 3 ] || fail "the command's exit code 3 came back as $rc"
grep -q "job=rt dir=$root" "$work/out" || fail "MEMENTO_JOB_ID/MEMENTO_RUN_DIR not passed"
grep -q "sock-ok" "$work/out" || fail "no agent socket while the command ran"
grep -q -- "--job not-memento" "$work/out" || fail "the command's own arguments were not passed as is"
grep -q "started agent" "$work/out" || fail "no 'started agent' line"
[ ! -e "$root/agent.sock" ] || fail "the started agent was not stopped (socket still there)"

# 3. SIGTERM to `memento run` reaches the command; exit 128+15.
"$bin" run --job rt --root "$root" --remove-on-exit -- sh -c \
  'trap "echo got-term; exit 143" TERM; echo ready; while :; do sleep 0.1; done' >"$work/out" 2>&1 &
runpid=$!
for _ in $(seq 1 300); do grep -q ready "$work/out" && break; sleep 0.1; done
grep -q ready "$work/out" || fail "the command did not start: $(cat "$work/out")"
kill -TERM "$runpid"
set +e; wait "$runpid"; rc=$?; set -e
grep -q got-term "$work/out" || fail "SIGTERM was not passed on: $(cat "$work/out")"
[ "$rc" = 143 ] || fail "after SIGTERM: exit $rc, expected 143"
[ ! -e "$root/agent.sock" ] || fail "the agent outlived a terminated run"

# 4. The started agent killed with SIGKILL while the command runs is started
#    again (the command sees an answering agent after it).
"$bin" run --job rt --root "$root" --remove-on-exit -- sh -c \
  'kill -9 "$MEMENTO_AGENT_PID"; for i in $(seq 1 600); do grep -q "restarting it" "$0" && grep -c "started agent pid" "$0" | grep -q 2 && exit 0; sleep 0.1; done; exit 9' \
  "$work/out4" >"$work/out4" 2>&1 || fail "the killed agent was not restarted: $(cat "$work/out4")"
cat "$work/out4"
[ ! -e "$root/agent.sock" ] || fail "the restarted agent was not stopped at the end"

# 5. An agent started separately is used and left running.
"$bin" agent --job rt --root "$root" --remove-on-exit >"$work/agent.out" 2>&1 &
sidecar=$!
for _ in $(seq 1 300); do [ -S "$root/agent.sock" ] && break; sleep 0.1; done
"$bin" run --job rt --root "$root" -- true >"$work/out" 2>&1 || fail "run with a sidecar agent failed: $(cat "$work/out")"
grep -q "using the agent already serving" "$work/out" || fail "the running agent was not used: $(cat "$work/out")"
kill -0 "$sidecar" || fail "the separately started agent was stopped by memento run"
kill -TERM "$sidecar"; wait "$sidecar" || true; sidecar=
echo "tools_run_test: OK"
