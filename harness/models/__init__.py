"""Model sources: where a teacher or student lives and what identifies its weights."""
