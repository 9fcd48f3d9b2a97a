"""The task factory: real-repository bug-fix tasks made from Python packages' sdists, without
Docker (`wharf tasks make`; docs/tasks-factory.md)."""
