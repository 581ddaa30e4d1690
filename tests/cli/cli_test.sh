#!/usr/bin/env bash
# tools_cli_test: the conventions every `memento` command follows (docs/architecture.md, "Command line").
#   1. A parse error (unknown flag, bad value, missing argument, unknown
#      command) exits 2 for every command, not CLI11's own codes.
#   2. --help exits 0 for every command and sub-command and lists the exit codes.
#   3. `verify --version STEP` still works, says it is deprecated, and is not in --help.
#   4. Every --json output is one JSON object on one line with a "schema"
#      field (run here for the cheap commands; the source check covers all).
#   5. `launch --json`: stdout is the summary's JSON object alone, the human
#      text is on stderr.
set -euo pipefail
bin=$1
src=$2
fail() { echo "tools_cli_test: FAIL: $*" >&2; exit 1; }
work=$(mktemp -d "${MEMENTO_TEST_TMPDIR:-/tmp}/cli-test.XXXXXX" 2>/dev/null || mktemp -d)
run_dir=$(mktemp -u /dev/shm/memento-cli-test.XXXXXX)
cleanup() { rm -rf "$work" "$run_dir"; }
trap cleanup EXIT

# rc CMD...: runs `memento CMD...`, stdout in $work/out, stderr in $work/err,
# the exit code in $rc.
run() { set +e; "$bin" "$@" >"$work/out" 2>"$work/err"; rc=$?; set -e; }

# Every command path, from the SUBCOMMANDS sections of the --help texts.
subcommands() {
  "$bin" "$@" --help | awk 'tolower($0) ~ /^subcommands:/ {on=1; next} on && /^  [a-z]/ {print $1; next} on && !/^  / {on=0}'
}
paths=()
for c in $(subcommands); do
  paths+=("$c")
  for s in $(subcommands "$c"); do paths+=("$c $s"); done
done
[ "${#paths[@]}" -ge 15 ] || fail "found only ${#paths[@]} commands in --help: ${paths[*]}"
echo "commands: ${paths[*]}"

# 1 + 2, for every command.
run --help
[ "$rc" = 0 ] || fail "memento --help exited $rc"
grep -q "Exit codes:" "$work/out" || fail "memento --help lists no exit codes"
# One command path: its --help and an unknown flag (4 paths at a time).
check_path() {
  local p=$1 d rc
  d=$(mktemp -d "$work/path.XXXXXX")
  # shellcheck disable=SC2086
  set +e; "$bin" $p --help >"$d/out" 2>"$d/err"; rc=$?; set -e
  [ "$rc" = 0 ] || { echo "memento $p --help exited $rc: $(cat "$d/err")"; return 1; }
  grep -q "Exit codes:" "$d/out" || { echo "memento $p --help lists no exit codes"; return 1; }
  # shellcheck disable=SC2086
  set +e; "$bin" $p --no-such-flag-xyz >"$d/out" 2>"$d/err"; rc=$?; set -e
  [ "$rc" = 2 ] || { echo "memento $p --no-such-flag-xyz exited $rc, expected 2: $(cat "$d/err")"; return 1; }
}
export -f check_path
export bin work
printf '%s\n' "${paths[@]}" | xargs -P 4 -I{} bash -c 'check_path "$1"' _ {} >"$work/paths" 2>&1 ||
  fail "$(cat "$work/paths")"
run no-such-command
[ "$rc" = 2 ] || fail "an unknown command exited $rc, expected 2"
run
[ "$rc" = 2 ] || fail "no command exited $rc, expected 2"
run verify
[ "$rc" = 2 ] || fail "verify without its DIR exited $rc, expected 2"
grep -qi "dir" "$work/err" || fail "verify without DIR does not name what is missing: $(cat "$work/err")"
run verify "$work" --step not-a-number
[ "$rc" = 2 ] || fail "verify --step not-a-number exited $rc, expected 2"
run plan layout --dp many
[ "$rc" = 2 ] || fail "plan layout --dp many exited $rc, expected 2"
run --version
[ "$rc" = 0 ] || fail "memento --version exited $rc"

# 3. verify --version STEP: the old spelling of --step.
mkdir -p "$work/durable"
run verify "$work/durable" --step 7
step_rc=$rc; cp "$work/out" "$work/step.out"
grep -q "deprecated" "$work/err" && fail "--step printed a deprecation line"
run verify "$work/durable" --version 7
[ "$rc" = "$step_rc" ] || fail "verify --version 7 exited $rc, --step 7 exited $step_rc"
cmp -s "$work/out" "$work/step.out" || fail "verify --version 7 printed something else than --step 7"
grep -q "memento verify: --version is deprecated; use --step 7" "$work/err" ||
  fail "verify --version says nothing about the deprecation: $(cat "$work/err")"
run verify --help
grep -q -- "--step" "$work/out" || fail "verify --help does not list --step"
grep -q -- "--version" "$work/out" && fail "verify --help still lists the deprecated --version"

# 4. One JSON style: one line, one object, "schema": "memento.<command>/N".
check_json() {  # SCHEMA CMD...
  local schema=$1; shift
  run "$@"
  [ "$rc" = 0 ] || fail "memento $* exited $rc: $(cat "$work/err")"
  [ "$(wc -l <"$work/out")" = 1 ] || fail "memento $* printed $(wc -l <"$work/out") lines, not one JSON line"
  python3 - "$work/out" "$schema" <<'PY' || fail "memento $*: $(cat "$work/out")"
import json, sys
j = json.load(open(sys.argv[1]))
assert isinstance(j, dict), "not an object"
assert j.get("schema") == sys.argv[2], "schema is %r, expected %r" % (j.get("schema"), sys.argv[2])
PY
}
check_json memento.verify/1 verify "$work/durable" --json
check_json memento.inspect.durable/1 inspect --tier durable "$work/durable" --json
check_json memento.gc/1 gc --root-base "$work/durable" --json
check_json memento.plan.layout/1 plan layout --dp 4 --policy xor --json
check_json memento.plan.reliability/1 plan reliability --nodes 12 --group-size 6 --policy xor --json
check_json memento.bench.tcp/1 bench tcp --bytes 1M --repeat 1 --json
# Every other --json in tools/ prints through PrintJson (tools/json_output.h),
# which adds the schema; a source that offers --json without it fails here.
for f in "$src"/tools/*.cc; do
  grep -q 'add_flag("--json"' "$f" || continue
  grep -q 'PrintJson(' "$f" || fail "$f offers --json but does not print through PrintJson"
  grep -q '\.dump([0-9])' "$f" && fail "$f prints indented JSON (dump(N)); --json is one line"
done

# 5. launch --json: the JSON object alone on stdout, progress on stderr.
run launch --json --nodes 1 --policy none --run-dir "$run_dir" -- /bin/true
[ "$rc" = 0 ] || fail "launch --json of /bin/true exited $rc: $(tail -20 "$work/err")"
[ "$(wc -l <"$work/out")" = 1 ] || fail "launch --json printed more than the JSON line: $(cat "$work/out")"
python3 - "$work/out" <<'PY' || fail "launch --json: $(cat "$work/out")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "memento.launch/1", j
assert j["exit_code"] == 0, j
PY
grep -q "^\[launch\] " "$work/err" || fail "launch --json: no progress lines on stderr: $(cat "$work/err")"
# 6. The environment variables memento reads at its edge (tools/environment.h):
# a value a variable does not take exits 2 naming it; a copy kernel named
# there is the one the process copies with (the library reads neither).
MEMENTO_DURABLE_IO=bogus run plan layout --dp 4 --policy xor --json
[ "$rc" = 2 ] || fail "MEMENTO_DURABLE_IO=bogus exited $rc, expected 2"
grep -q "MEMENTO_DURABLE_IO" "$work/err" || fail "MEMENTO_DURABLE_IO=bogus is not named: $(cat "$work/err")"
MEMENTO_COPY_KERNEL=portable run bench snapshot --size 8M --reps 1 --json
[ "$rc" = 0 ] || fail "MEMENTO_COPY_KERNEL=portable bench snapshot exited $rc: $(tail -5 "$work/err")"
python3 - "$work/out" <<'PY' || fail "MEMENTO_COPY_KERNEL=portable: $(cat "$work/out")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["kernel"] == "portable", j
PY
echo "tools_cli_test: PASS"
