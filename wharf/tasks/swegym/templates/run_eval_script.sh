# A SWE-bench 5.x eval_script (exit code recording added as swebench's make_test_spec does).
EVAL="$TESTS_DIR/eval.sh"
if [[ "$TESTBED" != /testbed ]]; then
    EVAL="$(mktemp)"
    trap 'rm -f "$EVAL"' EXIT
    sed "s#/testbed#$TESTBED#g" "$TESTS_DIR/eval.sh" > "$EVAL"
fi
timeout --kill-after=10 "$WHARF_TEST_TIMEOUT" bash "$EVAL" 2>&1 | tee -a "$LOG"
code=${PIPESTATUS[0]}
if [[ $code == 124 || $code == 137 ]]; then
    echo ">>>>> Tests Timed Out" | tee -a "$LOG"
fi
