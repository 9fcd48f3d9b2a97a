"""Whether a task dir holds, decided without an agent (`wharf tasks check`; docs/tasks.md):

    taskformat.py  the task dir's format: one line naming the file and field when broken
    targets.py     what the oracle's diff touches: the files, the functions under test
    exploits.py    tier 1 of the audit: cheap exploits of those functions and files
    audit.py       the order of the check, against a Grade (the judge, reached through trials)
    records.py     Change, Trial, TaskVerdict: the records across those seams

It imports only the core: the trials themselves (harbor in collect's bwrap sandbox) are bound in
wharf/pipeline/taskcheck/."""
