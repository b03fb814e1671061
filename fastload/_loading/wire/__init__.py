"""What crosses the pipes between the main process and its workers, and how."""
