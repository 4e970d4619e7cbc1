"""Report writers: per-suite summary (terminal and Markdown) from the JSONL records of a run."""
