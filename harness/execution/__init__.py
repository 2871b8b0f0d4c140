"""Running a grid: the plan, the scheduler and its local and Ray executors."""
