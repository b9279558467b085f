"""The `kvplane` command: client commands, the local-cluster launcher and the server entry points."""
