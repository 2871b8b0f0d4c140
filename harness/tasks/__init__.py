"""Tasks: task files to items and prompts, answer extraction, and scoring."""
