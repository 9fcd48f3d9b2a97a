# Source me (bash): run a test command and write a SWE-bench-style test log that grading.py
# can grade: the output between `>>>>> Start Test Output` / `>>>>> End Test Output`, then
# `>>>>> Test Exit Code: N` (swebench 5.x rejects a log that says PASSED but exited non-zero).
#
#   . /tests/testlog.sh
#   wharf_run_tests /logs/verifier/test_output.log 'pytest -rA tests/test_x.py' || true
#
# The command string runs in a subshell of the caller (conda activation, cwd and variables
# carry over). Output goes to stdout too (harbor keeps it in test-stdout.txt) and is appended
# to the log. Returns the command's exit status, so add `|| true` under `set -e`.
# WHARF_TEST_TIMEOUT=SECONDS (optional): stop the tests after that long and mark the log
# `>>>>> Tests Timed Out` (graded 0.0), keeping it below harbor's [verifier] timeout so a hung
# test suite still yields a reward instead of a verifier error.
wharf_run_tests() {
    local log="$1" cmd="$2" code had_e=0
    if [[ -z "$log" || -z "$cmd" ]]; then
        echo "wharf_run_tests: usage: wharf_run_tests LOG_FILE 'test command'" >&2
        return 2
    fi
    [[ $- == *e* ]] && had_e=1
    set +e  # the exit status must be recorded, not abort the caller
    mkdir -p "$(dirname "$log")"
    echo ">>>>> Start Test Output" | tee -a "$log"
    if [[ -n "${WHARF_TEST_TIMEOUT:-}" ]]; then
        # `timeout` runs a separate bash: pass the command and the caller's exported env.
        timeout --kill-after=10 "$WHARF_TEST_TIMEOUT" bash -c "$cmd" 2>&1 | tee -a "$log"
        code=${PIPESTATUS[0]}
    else
        ( eval "$cmd" ) 2>&1 | tee -a "$log"
        code=${PIPESTATUS[0]}
    fi
    echo ">>>>> End Test Output" | tee -a "$log"
    echo ">>>>> Test Exit Code: $code" | tee -a "$log"
    if [[ -n "${WHARF_TEST_TIMEOUT:-}" && ( $code == 124 || $code == 137 ) ]]; then
        echo ">>>>> Tests Timed Out" | tee -a "$log"
    fi
    (( had_e )) && set -e
    return "$code"
}
