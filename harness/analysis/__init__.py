"""Analysis: leaderboard, answers, studies, screening validation, and the report."""
