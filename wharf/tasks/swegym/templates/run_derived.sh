. "$TESTS_DIR/testlog.sh"
# The eval images keep the repo's env in conda env `testbed`.
if [[ -f /opt/miniconda3/bin/activate ]]; then
    source /opt/miniconda3/bin/activate && conda activate testbed
fi

# The agent may have edited the tests: put every file of the test patch back to the base commit
# (files the patch creates are removed), so the patch applies to what it was written against.
reset_test_files() {
    local f ok=0
    for f in "${TEST_FILES[@]}"; do
        if git cat-file -e "$BASE_COMMIT:$f" 2>/dev/null; then
            git checkout -q "$BASE_COMMIT" -- "$f" || ok=1
        else
            rm -f -- "$f"
        fi
    done
    return $ok
}

# Test configuration the agent planted or changed anywhere in the repo (conftest.py, ini files,
# sitecustomize.py, .pth files) goes back to the base commit too: it decides how tests run.
reset_test_config() {
    local f ok=0
    while IFS= read -r -d '' f; do
        case "${f##*/}" in
            conftest.py|pytest.ini|tox.ini|setup.cfg|pyproject.toml|sitecustomize.py|usercustomize.py|*.pth)
                if git cat-file -e "$BASE_COMMIT:$f" 2>/dev/null; then
                    git checkout -q "$BASE_COMMIT" -- "$f" || ok=1
                else
                    rm -f -- "$f"
                fi;;
        esac
    done < <(git diff -z --name-only "$BASE_COMMIT"; git ls-files -z --others)
    return $ok
}

if ! cd "$TESTBED"; then
    echo ">>>>> Reset Failed" | tee -a "$LOG"
elif ! reset_test_config || ! reset_test_files; then
    echo ">>>>> Reset Failed" | tee -a "$LOG"
elif ! git apply -v "$TESTS_DIR/test.patch"; then
    echo ">>>>> Patch Apply Failed" | tee -a "$LOG"
else
    wharf_run_tests "$LOG" @@TEST_CMD@@
    reset_test_files
fi
