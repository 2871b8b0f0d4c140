"""Statistics: per-adapter summaries and the teacher-level inference every answer rests on."""
